// The write side: ADIOS2 steps, puts and attributes as a Cairn writer's.
#include "CairnEngine.h"
#include "Json.h"
#include "Types.h"

#include <stdexcept>

namespace cairn_adios2
{
namespace
{

/// What a 0-d global put passes as its (empty) offset: not NULL, which would mean a local block.
const uint64_t NoOffset[1] = {0};

std::vector<uint64_t> U64(const adios2::Dims &d) { return std::vector<uint64_t>(d.begin(), d.end()); }

template <class T>
std::string JsonOfValue(const T &v, const std::string &what)
{
    if constexpr (std::is_same_v<T, std::string>)
        return JsonQuote(v);
    else if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
        return JsonNumber(v, what);
    else if constexpr (std::is_integral_v<T>)
        return std::to_string(static_cast<std::conditional_t<std::is_signed_v<T>, long long, unsigned long long>>(v));
    else
        throw std::invalid_argument("Cairn engine: " + what + " is of type " + adios2::GetType<T>() +
                                    ", which Cairn's attributes cannot hold (numbers, strings and arrays of them)");
}

template <class T>
std::string JsonOfAttribute(adios2::IO &io, const std::string &name)
{
    adios2::Attribute<T> a = io.InquireAttribute<T>(name);
    const std::vector<T> data = a.Data();
    const std::string what = "attribute '" + name + "'";
    if (a.IsValue() && data.size() == 1)
    {
        return JsonOfValue(data[0], what);
    }
    std::string out = "[";
    for (size_t i = 0; i < data.size(); ++i)
    {
        out += (i ? ", " : "") + JsonOfValue(data[i], what);
    }
    return out + "]";
}

} // namespace

void CairnEngine::OpenWriteStep()
{
    Check(cairn_begin_step(m_File, m_Step), "beginning step " + std::to_string(m_Step) + " of '" + m_Dataset + "'");
    m_StepOpen = true;
}

void CairnEngine::Define(const std::string &name, const char *dtype, int ndim, const std::vector<uint64_t> &shape)
{
    std::string sig = std::string(dtype) + "/" + std::to_string(ndim);
    for (const auto e : shape)
    {
        sig += "," + std::to_string(e);
    }
    auto it = m_Defined.find(name);
    if (it != m_Defined.end() && it->second == sig)
    {
        return;
    }
    Check(cairn_define(m_File, name.c_str(), dtype, ndim, shape.empty() ? nullptr : shape.data()),
          "defining variable '" + name + "'");
    m_Defined[name] = sig;
}

template <class T>
void CairnEngine::Put(adios2::Variable<T> variable, const T *values, bool deferred)
{
    const std::string name = variable.Name();
    const char *dtype = DTypeOf<T>();
    if (!dtype)
    {
        throw std::invalid_argument("Cairn engine: variable '" + name + "' is of type " + variable.Type() +
                                    ", which Cairn does not store (integers, floats and complex numbers only); "
                                    "write it as an attribute, or convert it");
    }
    if (!variable.Operations().empty())
    {
        throw std::invalid_argument("Cairn engine: variable '" + name +
                                    "' has an operator (compression): Cairn stages data as written and "
                                    "compresses only its drained files ([file] compression); remove the operation");
    }
    const adios2::ShapeID shapeID = variable.ShapeID();
    if (shapeID == adios2::ShapeID::JoinedArray)
    {
        throw std::invalid_argument("Cairn engine: variable '" + name +
                                    "' is a joined array, whose offsets Cairn would have to invent; "
                                    "give it a shape and each block's start");
    }
    if (SelectionOf(variable).HasMemorySelection())
    {
        throw std::invalid_argument("Cairn engine: variable '" + name +
                                    "' has a memory selection (SetMemorySelection), which Cairn's put does "
                                    "not take; copy the block into a contiguous buffer");
    }
    if (!m_StepOpen)
    {
        OpenWriteStep();
        m_ImplicitStep = true;
    }
    PendingPut p{name, values, false, {}, {}};
    switch (shapeID)
    {
    case adios2::ShapeID::GlobalValue:
        Define(name, dtype, 0, {});
        if (m_Rank != 0)
        {
            return; // one value for all ranks: rank 0's, as a 0-d variable has one element
        }
        break;
    case adios2::ShapeID::GlobalArray:
    {
        const auto shape = U64(variable.Shape());
        Define(name, dtype, static_cast<int>(shape.size()), shape);
        p.start = U64(variable.Start());
        p.count = U64(variable.Count());
        break;
    }
    case adios2::ShapeID::LocalValue:
        Define(name, dtype, -1, {});
        p.local = true;
        p.count = {1};
        break;
    case adios2::ShapeID::LocalArray:
        Define(name, dtype, -1, {});
        p.local = true;
        p.count = U64(variable.Count());
        break;
    default:
        throw std::invalid_argument("Cairn engine: variable '" + name + "' has no shape kind Cairn knows");
    }
    if (deferred)
    {
        m_Puts.push_back(std::move(p));
    }
    else
    {
        PutNow(p);
    }
}

void CairnEngine::PutNow(const PendingPut &p)
{
    const uint64_t *offset = p.local ? nullptr : (p.start.empty() ? NoOffset : p.start.data());
    Check(cairn_put(m_File, p.name.c_str(), p.data, static_cast<int>(p.count.size()), offset,
                    p.count.empty() ? NoOffset : p.count.data()),
          "putting variable '" + p.name + "' in step " + std::to_string(m_Step));
}

void CairnEngine::PerformPuts()
{
    std::vector<PendingPut> puts;
    puts.swap(m_Puts);
    for (const auto &p : puts)
    {
        PutNow(p);
    }
}

void CairnEngine::SendAttributes()
{
    for (const auto &kv : m_IO.AvailableAttributes())
    {
        const std::string &full = kv.first;
        // A variable's attribute is named "<variable>/<key>": the longest prefix that names a
        // variable this writer defined.
        std::string var, key = full;
        for (size_t cut = full.rfind('/'); cut != std::string::npos && cut > 0; cut = full.rfind('/', cut - 1))
        {
            if (m_Defined.count(full.substr(0, cut)))
            {
                var = full.substr(0, cut);
                key = full.substr(cut + 1);
                break;
            }
        }
        const std::string type = m_IO.AttributeType(full);
        std::string json;
#define CAIRN_JSON(T)                                                                              \
    if (json.empty() && type == adios2::GetType<T>())                                              \
    {                                                                                              \
        json = JsonOfAttribute<T>(m_IO, full);                                                     \
    }
        ADIOS2_FOREACH_ATTRIBUTE_STDTYPE_1ARG(CAIRN_JSON)
#undef CAIRN_JSON
        if (json.empty())
        {
            throw std::invalid_argument("Cairn engine: attribute '" + full + "' is of type " + type +
                                        ", which Cairn's attributes cannot hold");
        }
        std::string &sent = m_SentAttrs[var + '\x1f' + key];
        if (sent == json)
        {
            continue;
        }
        Check(cairn_set_attr(m_File, var.empty() ? nullptr : var.c_str(), key.c_str(), json.c_str()),
              "setting attribute '" + full + "'");
        sent = json;
    }
}

void CairnEngine::EndStep()
{
    if (!m_Writing)
    {
        if (!m_InStep)
        {
            throw std::invalid_argument("Cairn engine: EndStep on '" + m_Dataset + "' without BeginStep");
        }
        PerformGets();
        m_InStep = false;
        m_NextRead = m_Current + 1;
        return;
    }
    if (!m_StepOpen)
    {
        throw std::invalid_argument("Cairn engine: EndStep on '" + m_Dataset + "' without BeginStep");
    }
    PerformPuts();
    SendAttributes();
    Check(cairn_end_step(m_File), "ending step " + std::to_string(m_Step) + " of '" + m_Dataset + "'");
    m_StepOpen = false;
    m_ImplicitStep = false;
    ++m_Step;
}

#define CAIRN_PUTS(T)                                                                              \
    void CairnEngine::DoPutSync(adios2::Variable<T> variable, const T *values)                     \
    {                                                                                              \
        Put(variable, values, false);                                                              \
    }                                                                                              \
    void CairnEngine::DoPutDeferred(adios2::Variable<T> variable, const T *values)                 \
    {                                                                                              \
        Put(variable, values, true);                                                               \
    }
ADIOS2_FOREACH_STDTYPE_1ARG(CAIRN_PUTS)
#undef CAIRN_PUTS

} // namespace cairn_adios2
