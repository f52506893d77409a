// The engine's parameters, its ranks under a serial ADIOS2, and the check of the ADIOS2 it was
// loaded into.
#include "CairnEngine.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <link.h>
#include <stdexcept>

namespace cairn_adios2
{
namespace
{

std::string Lower(std::string s)
{
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    return s;
}

/// The keys the engine acts on, as the guide spells them.
const char *const Keys[] = {"PluginName", "PluginLibrary", "Config", "Engine", "Cluster", "Path", "Name"};

/// Hints of ADIOS2's own engines (BP5, SST) that Cairn has no use for: accepted and ignored, so
/// an XML file written for them only changes its engine type (docs/guide.md lists them).
const char *const Ignored[] = {"OpenTimeoutSecs",     "BeginStepPollingFrequencySecs",
                               "RendezvousReaderCount", "QueueLimit",
                               "QueueFullPolicy",     "ReserveQueueLimit",
                               "DataTransport",       "ControlTransport",
                               "MarshalMethod",       "FirstTimestepPrecious",
                               "AlwaysProvideLatestTimestep", "StepDistributionMode",
                               "NumAggregators",      "AggregatorRatio",
                               "AggregationType",     "NumSubFiles",
                               "BufferChunkSize",     "MaxShmSize",
                               "BufferVType",         "InitialBufferSize",
                               "Threads",             "FlushStepsCount",
                               "AsyncWrite",          "AsyncOpen",
                               "StatsLevel",          "Profile",
                               "ProfileUnits",        "Verbose",
                               "SelectSteps",         "OpenAsFile",
                               "BurstBufferPath",     "SubStreams",
                               "CollectiveMetadata",  "StripeSize",
                               "DirectIO",            "UseOneTimeAttributes"};

std::string Joined(const char *const *keys, size_t n)
{
    std::string s;
    for (size_t i = 0; i < n; ++i)
    {
        s += (i ? ", " : "");
        s += keys[i];
    }
    return s;
}

} // namespace

Settings ParseParameters(const adios2::Params &params)
{
    Settings out;
    for (const auto &kv : params)
    {
        const std::string key = Lower(kv.first);
        const std::string &value = kv.second;
        auto is = [&](const char *k) { return key == Lower(k); };
        if (is("PluginName"))
        {
            out.pluginName = value;
            continue;
        }
        if (is("PluginLibrary"))
        {
            continue;
        }
        if (std::find_if(std::begin(Ignored), std::end(Ignored), is) != std::end(Ignored))
        {
            continue;
        }
        if (value.find('\n') != std::string::npos && !is("Config"))
        {
            throw std::invalid_argument("Cairn engine: parameter " + kv.first +
                                        " holds a newline; give one line");
        }
        if (is("Config"))
        {
            out.config = value;
        }
        else if (is("Engine"))
        {
            const std::string e = Lower(value);
            if (e != "staging" && e != "file")
            {
                throw std::invalid_argument("Cairn engine: parameter Engine=" + value +
                                            ": use staging or file");
            }
            out.overrides += "engine=" + e + "\n";
        }
        else if (is("Cluster"))
        {
            out.overrides += "cluster=" + value + "\n";
        }
        else if (is("Name"))
        {
            out.name = value;
        }
        else if (is("Path"))
        {
            out.overrides += "path=" + value + "\n";
        }
        else
        {
            throw std::invalid_argument(
                "Cairn engine: unknown parameter " + kv.first + "; it accepts " +
                Joined(Keys, std::size(Keys)) + " (case-insensitive), and ignores " +
                Joined(Ignored, std::size(Ignored)) + " (hints of ADIOS2's own engines)");
        }
    }
    return out;
}

std::pair<int, int> LauncherRank()
{
    const char *pairs[][2] = {{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                              {"PMI_RANK", "PMI_SIZE"},
                              {"PMIX_RANK", "PMI_SIZE"},
                              {"SLURM_PROCID", "SLURM_NTASKS"}};
    for (const auto &p : pairs)
    {
        const char *r = std::getenv(p[0]);
        const char *n = std::getenv(p[1]);
        if (r && n)
        {
            char *end1 = nullptr, *end2 = nullptr;
            const long rank = std::strtol(r, &end1, 10);
            const long size = std::strtol(n, &end2, 10);
            if (*r == '\0' || *end1 != '\0' || *n == '\0' || *end2 != '\0' || rank < 0 ||
                size < 1 || rank >= size)
            {
                throw std::invalid_argument(std::string("Cairn engine: ") + p[0] + "=" + r + ", " +
                                            p[1] + "=" + n +
                                            " do not give a rank below the number of ranks");
            }
            return {static_cast<int>(rank), static_cast<int>(size)};
        }
    }
    return {0, 1};
}

namespace
{

struct Found
{
    int major = -1;
    int minor = -1;
    std::string path;
};

int OnObject(struct dl_phdr_info *info, size_t, void *data)
{
    const char *path = info->dlpi_name;
    if (!path)
    {
        return 0;
    }
    const char *base = std::strrchr(path, '/');
    base = base ? base + 1 : path;
    const char prefix[] = "libadios2_core.so.";
    if (std::strncmp(base, prefix, sizeof prefix - 1) != 0)
    {
        return 0;
    }
    int major = -1, minor = -1;
    if (std::sscanf(base + sizeof prefix - 1, "%d.%d", &major, &minor) == 2)
    {
        auto *f = static_cast<Found *>(data);
        *f = Found{major, minor, path};
        return 1;
    }
    return 0;
}

} // namespace

void CheckAdios2Version()
{
    Found found;
    dl_iterate_phdr(OnObject, &found);
    if (found.major >= 0 &&
        (found.major != ADIOS2_VERSION_MAJOR || found.minor != ADIOS2_VERSION_MINOR))
    {
        throw std::runtime_error(
            "Cairn engine: libcairn_adios2 was built for ADIOS2 " +
            std::to_string(ADIOS2_VERSION_MAJOR) + "." + std::to_string(ADIOS2_VERSION_MINOR) +
            " but this program runs ADIOS2 " + std::to_string(found.major) + "." +
            std::to_string(found.minor) + " (" + found.path +
            "); build it against that one: cairn adios2-plugin --build --adios2-dir DIR");
    }
}

} // namespace cairn_adios2
