// Opening, steps and closing of the Cairn plugin engine, and the entry points ADIOS2's plugin
// manager looks up (EngineCreate, EngineDestroy).
#include "CairnEngine.h"
#include "Types.h"

#include <stdexcept>

namespace cairn_adios2
{

namespace detail
{
// Each CoreOf<T> declares one plain function, defined by Expose<T, ...> below (on purpose).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnon-template-friend"
template <class T>
struct CoreOf
{
    using type = adios2::core::Variable<typename adios2::TypeInfo<T>::IOType> *adios2::Variable<T>::*;
    friend type Member(CoreOf);
};
#pragma GCC diagnostic pop
// An explicit instantiation may name a private member: this one hands out the pointer to
// adios2::Variable<T>::m_Variable through the friend declared above.
template <class T, typename CoreOf<T>::type M>
struct Expose
{
    friend typename CoreOf<T>::type Member(CoreOf<T>) { return M; }
};
} // namespace detail

template <class T>
adios2::core::Selection SelectionOf(const adios2::Variable<T> &v)
{
    auto *core = v.*Member(detail::CoreOf<T>{});
    // core::Variable<T> derives from core::VariableBase alone: the same address.
    return adios2::core::InferSelection(*reinterpret_cast<const adios2::core::VariableBase *>(core));
}

#define CAIRN_INSTANTIATE(T)                                                                       \
    template struct detail::Expose<T, &adios2::Variable<T>::m_Variable>;                           \
    template adios2::core::Selection SelectionOf<T>(const adios2::Variable<T> &);
ADIOS2_FOREACH_STDTYPE_1ARG(CAIRN_INSTANTIATE)
#undef CAIRN_INSTANTIATE

namespace
{

const char *ModeOf(adios2::Mode mode)
{
    switch (mode)
    {
    case adios2::Mode::Write: return "w";
    case adios2::Mode::Append: return "a";
    case adios2::Mode::Read:
    case adios2::Mode::ReadRandomAccess: return "r";
    default:
        throw std::invalid_argument("Cairn engine: open mode " +
                                    std::to_string(static_cast<int>(mode)) +
                                    " is not one Cairn has; use Write, Append, Read or ReadRandomAccess");
    }
}

} // namespace

CairnEngine::CairnEngine(adios2::IO io, const std::string &name, adios2::Mode mode, int rank, int size)
: PluginEngineInterface(io, name, mode), m_Writing(mode == adios2::Mode::Write || mode == adios2::Mode::Append),
  m_RandomAccess(!m_Writing)
{
    CheckAdios2Version();
    const Settings settings = ParseParameters(m_IO.Parameters());
    const char *cairnMode = ModeOf(mode);
    std::tie(m_Rank, m_Size) = rank >= 0 ? std::make_pair(rank, size) : LauncherRank();
    // ADIOS2 2.12 creates a plugin with its PluginName where the name given to Open belongs.
    m_Dataset = !settings.name.empty() ? settings.name : (name != settings.pluginName ? name : m_IO.Name());
    m_Config = settings.config;
    m_Overrides = settings.overrides;
    if (m_Writing)
    {
        Check(cairn_open_overrides(m_Dataset.c_str(), cairnMode, m_Config.empty() ? nullptr : m_Config.c_str(),
                                   m_Overrides.empty() ? nullptr : m_Overrides.c_str(), m_Rank, m_Size, &m_File),
              "opening '" + m_Dataset + "' (mode \"" + cairnMode + "\")");
        Check(cairn_next_step(m_File, &m_Step), "asking where '" + m_Dataset + "' resumes");
    }
    else if (OpenReader())
    {
        // ADIOS2 2.12 opens a plugin in Mode::Read when the code asks for ReadRandomAccess: until
        // its first BeginStep a reader reads as a file, steps chosen by SetStepSelection among
        // the committed ones, its variables those of the newest.
        size_t n = 0;
        Check(cairn_steps(m_File, nullptr, 0, &n), "listing the steps of '" + m_Dataset + "'");
        m_AllSteps.resize(n);
        Check(cairn_steps(m_File, m_AllSteps.data(), n, &n), "listing the steps of '" + m_Dataset + "'");
        m_AllSteps.resize(std::min(n, m_AllSteps.size()));
        if (!m_AllSteps.empty())
        {
            LoadStep({m_AllSteps.back()});
        }
    }
}

bool CairnEngine::OpenReader()
{
    const cairn_status s = cairn_open_overrides(m_Dataset.c_str(), "r", m_Config.empty() ? nullptr : m_Config.c_str(),
                                                m_Overrides.empty() ? nullptr : m_Overrides.c_str(), 0, 1, &m_File);
    if (s == CAIRN_ERR_NOT_FOUND)
    {
        // A reader may come before its writer: it waits in BeginStep.
        m_File = nullptr;
        return false;
    }
    Check(s, "opening '" + m_Dataset + "' (mode \"r\")");
    return true;
}

CairnEngine::~CairnEngine()
{
    if (m_File)
    {
        cairn_close(m_File);
    }
}

void CairnEngine::Fail(cairn_status s, const std::string &what) const
{
    const std::string msg = "Cairn engine: " + what + ": " + cairn_last_error();
    if (s == CAIRN_ERR_INVALID_ARGUMENT || s == CAIRN_ERR_NOT_FOUND || s == CAIRN_ERR_CONFIG)
    {
        throw std::invalid_argument(msg);
    }
    throw std::runtime_error(msg);
}

void CairnEngine::Check(cairn_status s, const std::string &what) const
{
    if (s != CAIRN_OK)
    {
        Fail(s, what);
    }
}

adios2::StepStatus CairnEngine::BeginStep(adios2::StepMode mode, const float timeoutSeconds)
{
    if (m_Writing)
    {
        if (mode != adios2::StepMode::Append && mode != adios2::StepMode::Update)
        {
            throw std::invalid_argument("Cairn engine: BeginStep(StepMode::Read) on '" + m_Dataset +
                                        "', which is open for writing");
        }
        if (m_StepOpen)
        {
            throw std::invalid_argument("Cairn engine: BeginStep on '" + m_Dataset + "' while step " +
                                        std::to_string(m_Step) + " is open; call EndStep first");
        }
        OpenWriteStep();
        return adios2::StepStatus::OK;
    }
    m_RandomAccess = false;
    return BeginReadStep(timeoutSeconds);
}

size_t CairnEngine::CurrentStep() const
{
    return m_Writing ? m_Step : (m_InStep ? m_Current : m_NextRead);
}

size_t CairnEngine::Steps() const
{
    if (m_RandomAccess || !m_File)
    {
        return m_AllSteps.size();
    }
    size_t n = 0;
    Check(cairn_steps(m_File, nullptr, 0, &n), "counting the steps of '" + m_Dataset + "'");
    return n;
}

void CairnEngine::DoClose(const int)
{
    Closing();
}

void CairnEngine::Closing()
{
    if (!m_File)
    {
        return;
    }
    if (m_Writing && m_StepOpen)
    {
        EndStep();
    }
    cairn_file *f = m_File;
    m_File = nullptr;
    Check(cairn_close(f), "closing '" + m_Dataset + "'");
}

} // namespace cairn_adios2

extern "C" {

#if ADIOS2_USE_MPI
// Under an MPI ADIOS2 the ranks are the IO's communicator's.
cairn_adios2::CairnEngine *EngineCreate(adios2::IO io, const std::string &name, const adios2::Mode mode, MPI_Comm comm)
{
    int rank = 0, size = 1;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    return new cairn_adios2::CairnEngine(io, name, mode, rank, size);
}
#else
cairn_adios2::CairnEngine *EngineCreate(adios2::IO io, const std::string &name, const adios2::Mode mode)
{
    return new cairn_adios2::CairnEngine(io, name, mode);
}
#endif

void EngineDestroy(cairn_adios2::CairnEngine *obj) { delete obj; }
}
