// The Cairn plugin engine of ADIOS2 (libcairn_adios2.so): an unmodified ADIOS2 code selects it in
// its XML file (<engine type="Plugin">, PluginName=cairn, PluginLibrary=cairn_adios2) and its
// steps, variables and attributes go to a Cairn dataset through libcairn's C API.
#ifndef CAIRN_ADIOS2_ENGINE_H
#define CAIRN_ADIOS2_ENGINE_H

#include "adios2/plugin/PluginEngineInterface.h"

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <vector>

extern "C" {
#include "cairn.h"
}

namespace cairn_adios2
{

/// What the engine's parameters say (Params.cpp).
struct Settings
{
    /// `Config`: a cairn.toml's path or TOML text; empty: cairn.open's default.
    std::string config;
    /// `key=value` lines from `Engine`, `Cluster` and `Path`, winning over the config.
    std::string overrides;
    /// `Name`: the dataset's name; empty: the name given to Open where ADIOS2 passes it on, else
    /// the IO's name.
    std::string name;
    /// `PluginName`, which ADIOS2 2.12 passes to the plugin in place of the name given to Open.
    std::string pluginName;
};

/// Parses the IO's parameters (keys matched case-insensitively); an unknown key is an
/// std::invalid_argument naming the accepted ones.
Settings ParseParameters(const adios2::Params &params);

/// This process's rank and the number of ranks, from the launcher's environment (Open MPI,
/// PMI, Slurm), else 0 of 1.
std::pair<int, int> LauncherRank();

/// Throws std::runtime_error when the ADIOS2 loaded in the process is not the major.minor the
/// engine was built for.
void CheckAdios2Version();

/// A put kept until PerformPuts or EndStep (ADIOS2's Deferred mode: the buffer stays the
/// caller's until then).
struct PendingPut
{
    std::string name;
    const void *data;
    bool local;
    std::vector<uint64_t> start;
    std::vector<uint64_t> count;
};

/// A get kept until PerformGets or EndStep: the box (or block) and steps it reads.
struct PendingGet
{
    std::string name;
    void *data;
    size_t elementSize;
    bool value;            // a global single value (0-d)
    bool local;            // a local array: read block `block`
    bool block;            // a block selection of a global array
    size_t blockID;
    std::vector<uint64_t> start;
    std::vector<uint64_t> count;
    std::vector<uint64_t> steps; // the Cairn steps it reads, in order
};

/// One variable of the step being read, as Cairn describes it.
struct ReadVar
{
    std::string dtype;
    int ndim = 0; // -1: local
    std::vector<uint64_t> shape;
    bool constant = false;
    uint64_t step = 0; // the newest step it is read from
};

/// The Cairn plugin engine: a writer (Mode::Write → "w", Mode::Append → "a") or a reader
/// (Mode::Read, Mode::ReadRandomAccess → "r").
class CairnEngine : public adios2::plugin::PluginEngineInterface
{
public:
    /// `rank` of `size`: the IO's communicator's under an MPI ADIOS2; -1: the launcher's.
    CairnEngine(adios2::IO io, const std::string &name, adios2::Mode mode, int rank = -1, int size = -1);
    ~CairnEngine() override;

    adios2::StepStatus BeginStep(adios2::StepMode mode, const float timeoutSeconds = -1.0f) override;
    void EndStep() override;
    size_t CurrentStep() const override;
    void PerformPuts() override;
    void PerformGets() override;
    size_t Steps() const override;
    adios2::MinVarInfo *MinBlocksInfo(const std::string &varName, const size_t step) const override;

protected:
#define CAIRN_DECLARE(T)                                                                           \
    void DoPutSync(adios2::Variable<T> variable, const T *values) override;                        \
    void DoPutDeferred(adios2::Variable<T> variable, const T *values) override;                    \
    void DoGetSync(adios2::Variable<T> variable, T *values) override;                              \
    void DoGetDeferred(adios2::Variable<T> variable, T *values) override;                          \
    void DoGetSync(adios2::Variable<T> variable, T *values,                                        \
                   const adios2::core::Selection &sel) override;                                   \
    void DoGetDeferred(adios2::Variable<T> variable, T *values,                                    \
                       const adios2::core::Selection &sel) override;
    ADIOS2_FOREACH_STDTYPE_1ARG(CAIRN_DECLARE)
#undef CAIRN_DECLARE

    void DoClose(const int transportIndex = -1) override;

private:
    cairn_file *m_File = nullptr;
    std::string m_Dataset; // the Cairn dataset's name
    std::string m_Config, m_Overrides; // a reader opens again until the dataset is there
    bool m_Writing;
    bool m_RandomAccess; // a reader before its first BeginStep: reads as a file
    int m_Rank = 0;
    int m_Size = 1;

    // Writer state.
    bool m_StepOpen = false;
    bool m_ImplicitStep = false; // a Put outside BeginStep/EndStep: one step, ended at Close
    uint64_t m_Step = 0;
    bool m_Begun = false; // a step was begun since open
    std::map<std::string, std::string> m_Defined;    // variable -> its definition's signature
    std::map<std::string, std::string> m_SentAttrs;  // "var\x1fkey" -> JSON sent
    std::vector<PendingPut> m_Puts;

    // Reader state.
    uint64_t m_NextRead = 0;
    bool m_InStep = false;
    uint64_t m_Current = 0; // the step being read
    std::vector<uint64_t> m_AllSteps; // the committed steps at open, for random access
    std::map<std::string, ReadVar> m_Vars;
    std::set<std::string> m_DatasetAttrs; // the dataset attributes defined in the IO
    std::vector<PendingGet> m_Gets;
    mutable std::map<std::string, std::vector<uint64_t>> m_BlockDims; // MinBlocksInfo's storage
    mutable std::vector<std::vector<unsigned char>> m_Values;

    void Fail(cairn_status s, const std::string &what) const;
    void Check(cairn_status s, const std::string &what) const;
    void Closing();

    // Write side (CairnWrite.cpp).
    void OpenWriteStep();
    template <class T>
    void Put(adios2::Variable<T> variable, const T *values, bool deferred);
    void Define(const std::string &name, const char *dtype, int ndim, const std::vector<uint64_t> &shape);
    void PutNow(const PendingPut &p);
    void SendAttributes();

    // Read side (CairnRead.cpp).
    adios2::StepStatus BeginReadStep(float timeoutSeconds);
    void LoadStep(const std::vector<uint64_t> &steps);
    void LoadAttributes(uint64_t step, const std::vector<std::string> &newVars);
    bool OpenReader();
    adios2::StepStatus Enter(uint64_t step);
    template <class T>
    PendingGet Selected(adios2::Variable<T> variable, T *values, const adios2::core::Selection &sel);
    void GetNow(const PendingGet &g);
    uint64_t ReadStepOf(size_t step) const;
    std::vector<cairn_block> Blocks(const std::string &name, uint64_t step) const;
    std::string Text(const std::function<cairn_status(char *, size_t, size_t *)> &call, const std::string &what) const;
};

} // namespace cairn_adios2

extern "C" {
#if ADIOS2_USE_MPI
__attribute__((visibility("default"))) cairn_adios2::CairnEngine *
EngineCreate(adios2::IO io, const std::string &name, const adios2::Mode mode, MPI_Comm comm);
#else
__attribute__((visibility("default"))) cairn_adios2::CairnEngine *
EngineCreate(adios2::IO io, const std::string &name, const adios2::Mode mode);
#endif
__attribute__((visibility("default"))) void EngineDestroy(cairn_adios2::CairnEngine *obj);
}

#endif
