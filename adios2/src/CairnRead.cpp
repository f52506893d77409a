// The read side: committed Cairn steps as ADIOS2 steps, their variables and attributes defined in
// the IO, gets of boxes, blocks and steps, and each block's statistics for BlocksInfo.
#include "CairnEngine.h"
#include "Json.h"
#include "Types.h"

#include <chrono>
#include <cstring>
#include <cmath>
#include <limits>
#include <set>
#include <stdexcept>
#include <thread>

namespace cairn_adios2
{
namespace
{

const uint64_t NoOffset[1] = {0};

template <class T>
struct Tag
{
    using type = T;
};

/// Calls `f(Tag<T>{})` for the ADIOS2 type T of Cairn dtype `dtype`; false for a dtype ADIOS2
/// has no type for.
template <class F>
bool WithType(const std::string &dtype, F &&f)
{
    if (dtype == "i1") f(Tag<int8_t>{});
    else if (dtype == "i2") f(Tag<int16_t>{});
    else if (dtype == "i4") f(Tag<int32_t>{});
    else if (dtype == "i8") f(Tag<int64_t>{});
    else if (dtype == "u1") f(Tag<uint8_t>{});
    else if (dtype == "u2") f(Tag<uint16_t>{});
    else if (dtype == "u4") f(Tag<uint32_t>{});
    else if (dtype == "u8") f(Tag<uint64_t>{});
    else if (dtype == "f4") f(Tag<float>{});
    else if (dtype == "f8") f(Tag<double>{});
    else if (dtype == "c8") f(Tag<std::complex<float>>{});
    else if (dtype == "c16") f(Tag<std::complex<double>>{});
    else return false;
    return true;
}

template <class T>
void SetMinMax(adios2::MinMaxStruct &mm, double min, double max)
{
    std::memset(&mm, 0, sizeof mm);
    if constexpr (std::is_arithmetic_v<T>)
    {
        if (std::isfinite(min) && std::isfinite(max))
        {
            *reinterpret_cast<T *>(&mm.MinUnion) = static_cast<T>(min);
            *reinterpret_cast<T *>(&mm.MaxUnion) = static_cast<T>(max);
        }
    }
}

uint64_t Product(const uint64_t *count, int ndim)
{
    uint64_t n = 1;
    for (int i = 0; i < ndim; ++i)
    {
        n *= count[i];
    }
    return n;
}

} // namespace

adios2::StepStatus CairnEngine::BeginReadStep(float timeoutSeconds)
{
    if (m_InStep)
    {
        throw std::invalid_argument("Cairn engine: BeginStep on '" + m_Dataset + "' while step " +
                                    std::to_string(m_Current) + " is open; call EndStep first");
    }
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + std::chrono::duration<double>(std::max(0.0f, timeoutSeconds));
    const std::string next = "step " + std::to_string(m_NextRead) + " of '" + m_Dataset + "'";
    for (;;)
    {
        const double left = timeoutSeconds < 0 ? 1.0 : std::chrono::duration<double>(deadline - Clock::now()).count();
        // Until the dataset is there (the file engine's appears with its writer), no step is.
        if (!m_File && !OpenReader())
        {
            if (left <= 0)
            {
                return adios2::StepStatus::NotReady;
            }
            std::this_thread::sleep_for(std::chrono::duration<double>(std::min(left, 0.05)));
            continue;
        }
        // The next step, waited for in slices of at most a second: between them the reader
        // learns whether it was skipped (released before it came) or the writers closed.
        int committed = 0;
        Check(cairn_wait_step(m_File, m_NextRead, std::max(0.0, std::min(left, 1.0)), &committed), "waiting for " + next);
        if (committed)
        {
            return Enter(m_NextRead);
        }
        uint64_t newest = 0;
        int any = 0, closed = 0;
        Check(cairn_stream_state(m_File, &newest, &any, &closed), "asking the state of '" + m_Dataset + "'");
        if (any && newest > m_NextRead)
        {
            size_t n = 0;
            Check(cairn_steps(m_File, nullptr, 0, &n), "listing the steps of '" + m_Dataset + "'");
            std::vector<uint64_t> steps(n);
            Check(cairn_steps(m_File, steps.data(), n, &n), "listing the steps of '" + m_Dataset + "'");
            steps.resize(std::min(n, steps.size()));
            for (const uint64_t s : steps)
            {
                if (s >= m_NextRead)
                {
                    return Enter(s);
                }
            }
        }
        if (closed)
        {
            return adios2::StepStatus::EndOfStream;
        }
        if (timeoutSeconds >= 0 && std::chrono::duration<double>(deadline - Clock::now()).count() <= 0)
        {
            return adios2::StepStatus::NotReady;
        }
    }
}

adios2::StepStatus CairnEngine::Enter(uint64_t step)
{
    m_Current = step;
    LoadStep({step});
    m_InStep = true;
    return adios2::StepStatus::OK;
}

void CairnEngine::LoadStep(const std::vector<uint64_t> &steps)
{
    std::map<std::string, ReadVar> vars;
    for (const uint64_t s : steps)
    {
        const std::string names = Text([&](char *buf, size_t cap, size_t *len) { return cairn_step_vars(m_File, s, buf, cap, len); },
                                       "listing the variables of step " + std::to_string(s));
        size_t at = 0;
        while (at < names.size())
        {
            size_t end = names.find('\n', at);
            end = end == std::string::npos ? names.size() : end;
            const std::string name = names.substr(at, end - at);
            at = end + 1;
            char dtype[8] = {0};
            int ndim = 0, constant = 0;
            uint64_t shape[CAIRN_MAX_DIMS] = {0};
            Check(cairn_var_info(m_File, name.c_str(), s, dtype, &ndim, shape, &constant),
                  "asking variable '" + name + "' of step " + std::to_string(s));
            ReadVar v{dtype, ndim, std::vector<uint64_t>(shape, shape + std::max(ndim, 0)), constant != 0, s};
            if (v.constant)
            {
                Check(cairn_constant_step(m_File, name.c_str(), &v.step), "asking constant '" + name + "'");
            }
            vars[name] = std::move(v);
        }
    }
    for (const auto &kv : m_Vars)
    {
        if (!vars.count(kv.first))
        {
            m_IO.RemoveVariable(kv.first);
        }
    }
    for (const auto &kv : vars)
    {
        const std::string &name = kv.first;
        const ReadVar &v = kv.second;
        auto old = m_Vars.find(name);
        const bool same = old != m_Vars.end() && old->second.dtype == v.dtype && old->second.ndim == v.ndim;
        WithType(v.dtype, [&](auto tag) {
            using T = typename decltype(tag)::type;
            if (!same && m_IO.InquireVariableType(name) != adios2::DataType::None)
            {
                m_IO.RemoveVariable(name);
            }
            adios2::Variable<T> var = same ? m_IO.InquireVariable<T>(name) : adios2::Variable<T>();
            const adios2::Dims shape(v.shape.begin(), v.shape.end());
            if (v.ndim == -1)
            {
                // A local array's count is its first block's in this step (what a code that
                // sizes its buffer by Count() reads).
                const auto blocks = Blocks(name, v.step);
                const adios2::Dims count = blocks.empty() ? adios2::Dims{1}
                                                          : adios2::Dims(blocks[0].count, blocks[0].count + blocks[0].ndim);
                if (!var)
                {
                    m_IO.DefineVariable<T>(name, {}, {}, count);
                }
                else if (var.Count() != count)
                {
                    var.SetSelection({{}, count});
                }
            }
            else if (v.ndim == 0)
            {
                if (!var)
                {
                    m_IO.DefineVariable<T>(name);
                }
            }
            else if (!var)
            {
                m_IO.DefineVariable<T>(name, shape, adios2::Dims(shape.size(), 0), shape);
            }
            else if (old->second.shape != v.shape)
            {
                var.SetShape(shape);
                var.SetSelection({adios2::Dims(shape.size(), 0), shape});
            }
        });
    }
    std::vector<std::string> fresh;
    for (const auto &kv : vars)
    {
        auto old = m_Vars.find(kv.first);
        if (old == m_Vars.end() || old->second.dtype != kv.second.dtype || old->second.ndim != kv.second.ndim)
        {
            fresh.push_back(kv.first);
        }
    }
    m_Vars = std::move(vars);
    if (!steps.empty())
    {
        LoadAttributes(steps.back(), fresh);
    }
}

namespace
{

void DefineOnce(adios2::IO &io, const std::string &key, const Json &v, const std::string &var);

/// Defines attribute `key` (of variable `var`, or of the IO for "") from its JSON value, in place
/// of one of the same name.
void DefineFromJson(adios2::IO &io, const std::string &key, const Json &v, const std::string &var)
{
    try
    {
        DefineOnce(io, key, v, var);
    }
    catch (const std::exception &)
    {
        io.RemoveAttribute(var.empty() ? key : var + "/" + key); // it had another type
        DefineOnce(io, key, v, var);
    }
}

void DefineOnce(adios2::IO &io, const std::string &key, const Json &v, const std::string &var)
{
    using K = Json::Kind;
    switch (v.kind)
    {
    case K::String: io.DefineAttribute<std::string>(key, v.text, var, "/", true); return;
    case K::Int: io.DefineAttribute<int64_t>(key, v.integer, var, "/", true); return;
    case K::Float: io.DefineAttribute<double>(key, v.number, var, "/", true); return;
    case K::Bool: io.DefineAttribute<int32_t>(key, v.boolean ? 1 : 0, var, "/", true); return;
    case K::Array:
    {
        bool strings = !v.items.empty(), ints = !v.items.empty(), numbers = !v.items.empty();
        for (const auto &i : v.items)
        {
            strings &= i.kind == K::String;
            ints &= i.kind == K::Int;
            numbers &= i.kind == K::Int || i.kind == K::Float;
        }
        if (strings)
        {
            std::vector<std::string> a;
            for (const auto &i : v.items) a.push_back(i.text);
            io.DefineAttribute<std::string>(key, a.data(), a.size(), var, "/", true);
        }
        else if (ints)
        {
            std::vector<int64_t> a;
            for (const auto &i : v.items) a.push_back(i.integer);
            io.DefineAttribute<int64_t>(key, a.data(), a.size(), var, "/", true);
        }
        else if (numbers)
        {
            std::vector<double> a;
            for (const auto &i : v.items) a.push_back(i.number);
            io.DefineAttribute<double>(key, a.data(), a.size(), var, "/", true);
        }
        return;
    }
    default: return; // null and objects: ADIOS2 has no attribute for them
    }
}

} // namespace

void CairnEngine::LoadAttributes(uint64_t step, const std::vector<std::string> &newVars)
{
    auto load = [&](const char *var, uint64_t s) {
        const std::string what = var ? "the attributes of variable '" + std::string(var) + "'" : "the attributes of '" + m_Dataset + "'";
        return ParseJson(Text([&](char *buf, size_t cap, size_t *len) { return cairn_attrs(m_File, var, s, buf, cap, len); },
                              "reading " + what));
    };
    // The dataset's may change from step to step; a variable's are fixed at its first step.
    const Json dataset = ParseJson(Text([&](char *buf, size_t cap, size_t *len) { return cairn_step_attrs(m_File, step, buf, cap, len); },
                                        "reading the attributes of '" + m_Dataset + "' at step " + std::to_string(step)));
    std::set<std::string> keys;
    for (const auto &m : dataset.members)
    {
        DefineFromJson(m_IO, m.first, m.second, "");
        keys.insert(m.first);
    }
    for (const auto &gone : m_DatasetAttrs)
    {
        if (!keys.count(gone))
        {
            m_IO.RemoveAttribute(gone);
        }
    }
    m_DatasetAttrs = std::move(keys);
    for (const auto &var : newVars)
    {
        for (const auto &m : load(var.c_str(), m_Vars.at(var).step).members)
        {
            DefineFromJson(m_IO, m.first, m.second, var);
        }
    }
}

std::string CairnEngine::Text(const std::function<cairn_status(char *, size_t, size_t *)> &call, const std::string &what) const
{
    // One call in the common case: a buffer most answers fit in, sized to the answer otherwise.
    std::string text(4096, '\0');
    size_t len = 0;
    Check(call(text.data(), text.size(), &len), what);
    if (len >= text.size())
    {
        text.assign(len + 1, '\0');
        Check(call(text.data(), text.size(), &len), what);
    }
    text.resize(len);
    return text;
}

std::vector<cairn_block> CairnEngine::Blocks(const std::string &name, uint64_t step) const
{
    size_t n = 0;
    Check(cairn_blocks(m_File, name.c_str(), step, nullptr, 0, &n), "listing the blocks of '" + name + "'");
    std::vector<cairn_block> blocks(n);
    Check(cairn_blocks(m_File, name.c_str(), step, blocks.data(), n, &n), "listing the blocks of '" + name + "'");
    blocks.resize(std::min(n, blocks.size()));
    return blocks;
}

uint64_t CairnEngine::ReadStepOf(size_t step) const
{
    if (!m_RandomAccess)
    {
        return m_Current;
    }
    if (step >= m_AllSteps.size())
    {
        throw std::invalid_argument("Cairn engine: step " + std::to_string(step) + " of '" + m_Dataset + "': it has " +
                                    std::to_string(m_AllSteps.size()) + " steps");
    }
    return m_AllSteps[step];
}

template <class T>
PendingGet CairnEngine::Selected(adios2::Variable<T> variable, T *values, const adios2::core::Selection &sel)
{
    const std::string name = variable.Name();
    if (!DTypeOf<T>())
    {
        throw std::invalid_argument("Cairn engine: variable '" + name + "' is of type " + variable.Type() +
                                    ", which Cairn does not store");
    }
    auto it = m_Vars.find(name);
    if (it == m_Vars.end())
    {
        throw std::invalid_argument("Cairn engine: variable '" + name + "' is not in this step of '" + m_Dataset + "'");
    }
    if (sel.HasMemorySelection())
    {
        throw std::invalid_argument("Cairn engine: variable '" + name +
                                    "' has a memory selection (SetMemorySelection), which Cairn's get does not "
                                    "take; read into a contiguous buffer");
    }
    if (!m_RandomAccess && !m_InStep)
    {
        throw std::invalid_argument("Cairn engine: Get of '" + name + "' outside BeginStep/EndStep");
    }
    const ReadVar &v = it->second;
    PendingGet g{name, values, sizeof(T), v.ndim == 0, v.ndim == -1, false, 0, {}, {}, {}};
    const size_t first = m_RandomAccess ? sel.GetStepStart() : 0;
    const size_t count = m_RandomAccess ? sel.GetStepCount() : 1;
    for (size_t i = 0; i < count; ++i)
    {
        g.steps.push_back(v.constant ? v.step : ReadStepOf(first + i));
    }
    if (g.local)
    {
        g.blockID = sel.HasBlockSelection() ? sel.GetBlockID() : variable.BlockID();
    }
    else if (!g.value)
    {
        if (sel.GetSelectionType() == adios2::SelectionType::BoundingBox)
        {
            g.start.assign(sel.GetStart().begin(), sel.GetStart().end());
            g.count.assign(sel.GetCount().begin(), sel.GetCount().end());
        }
        else if (sel.HasBlockSelection())
        {
            g.block = true;
            g.blockID = sel.GetBlockID();
        }
        else
        {
            g.start.assign(v.shape.size(), 0);
            g.count = v.shape;
        }
    }
    return g;
}

void CairnEngine::GetNow(const PendingGet &g)
{
    auto *out = static_cast<unsigned char *>(g.data);
    for (const uint64_t s : g.steps)
    {
        const std::string what = "reading variable '" + g.name + "' at step " + std::to_string(s);
        if (g.value)
        {
            Check(cairn_get(m_File, g.name.c_str(), s, 0, NoOffset, NoOffset, out, g.elementSize), what);
            out += g.elementSize;
            continue;
        }
        if (g.local || g.block)
        {
            const auto blocks = Blocks(g.name, s);
            if (g.blockID >= blocks.size())
            {
                throw std::invalid_argument("Cairn engine: block " + std::to_string(g.blockID) + " of variable '" + g.name +
                                            "' at step " + std::to_string(s) + ": it has " + std::to_string(blocks.size()) +
                                            " blocks");
            }
            const cairn_block &b = blocks[g.blockID];
            const size_t bytes = Product(b.count, b.ndim) * g.elementSize;
            if (g.local)
            {
                Check(cairn_get_local(m_File, g.name.c_str(), s, b.writer, out, bytes), what);
            }
            else
            {
                Check(cairn_get(m_File, g.name.c_str(), s, b.ndim, b.offset, b.count, out, bytes), what);
            }
            out += bytes;
            continue;
        }
        const size_t bytes = Product(g.count.data(), static_cast<int>(g.count.size())) * g.elementSize;
        Check(cairn_get(m_File, g.name.c_str(), s, static_cast<int>(g.count.size()),
                        g.start.empty() ? NoOffset : g.start.data(), g.count.empty() ? NoOffset : g.count.data(), out,
                        bytes),
              what);
        out += bytes;
    }
}

void CairnEngine::PerformGets()
{
    std::vector<PendingGet> gets;
    gets.swap(m_Gets);
    for (const auto &g : gets)
    {
        GetNow(g);
    }
}

adios2::MinVarInfo *CairnEngine::MinBlocksInfo(const std::string &varName, const size_t step) const
{
    auto it = m_Vars.find(varName);
    if (m_Writing || !m_File || it == m_Vars.end())
    {
        return nullptr;
    }
    const ReadVar &v = it->second;
    const uint64_t s = v.constant ? v.step : ReadStepOf(step);
    const auto blocks = Blocks(varName, s);
    m_BlockDims.clear();
    m_Values.clear();
    const int dims = v.ndim == -1 ? (blocks.empty() ? 1 : blocks[0].ndim) : v.ndim;
    std::vector<size_t> &shape = m_BlockDims[""];
    shape.assign(v.shape.begin(), v.shape.end());
    auto *mvi = new adios2::MinVarInfo(dims, v.ndim == -1 ? nullptr : shape.data());
    mvi->Step = step;
    mvi->WasLocalValue = false;
    mvi->IsValue = v.ndim == 0;
    for (size_t i = 0; i < blocks.size(); ++i)
    {
        const cairn_block &b = blocks[i];
        adios2::MinBlockInfo bi;
        bi.WriterID = static_cast<int>(b.writer);
        bi.BlockID = i;
        std::vector<size_t> &start = m_BlockDims["s" + std::to_string(i)];
        std::vector<size_t> &count = m_BlockDims["c" + std::to_string(i)];
        start.assign(b.offset, b.offset + b.ndim);
        count.assign(b.count, b.count + b.ndim);
        bi.Start = start.data();
        bi.Count = count.data();
        WithType(v.dtype, [&](auto tag) {
            using T = typename decltype(tag)::type;
            SetMinMax<T>(bi.MinMax, b.min, b.max);
            if (mvi->IsValue)
            {
                m_Values.emplace_back(sizeof(T));
                Check(cairn_get(m_File, varName.c_str(), s, 0, NoOffset, NoOffset, m_Values.back().data(), sizeof(T)),
                      "reading value '" + varName + "'");
                bi.BufferP = m_Values.back().data();
            }
        });
        mvi->BlocksInfo.push_back(bi);
    }
    return mvi;
}

#define CAIRN_GETS(T)                                                                              \
    void CairnEngine::DoGetSync(adios2::Variable<T> variable, T *values)                           \
    {                                                                                              \
        GetNow(Selected(variable, values, SelectionOf(variable)));                                 \
    }                                                                                              \
    void CairnEngine::DoGetDeferred(adios2::Variable<T> variable, T *values)                       \
    {                                                                                              \
        m_Gets.push_back(Selected(variable, values, SelectionOf(variable)));                       \
    }                                                                                              \
    void CairnEngine::DoGetSync(adios2::Variable<T> variable, T *values,                           \
                                const adios2::core::Selection &sel)                                \
    {                                                                                              \
        GetNow(Selected(variable, values, sel));                                                   \
    }                                                                                              \
    void CairnEngine::DoGetDeferred(adios2::Variable<T> variable, T *values,                       \
                                    const adios2::core::Selection &sel)                            \
    {                                                                                              \
        m_Gets.push_back(Selected(variable, values, sel));                                         \
    }
ADIOS2_FOREACH_STDTYPE_1ARG(CAIRN_GETS)
#undef CAIRN_GETS

} // namespace cairn_adios2
