// What the Cairn engine refuses, each with std::invalid_argument naming the variable: one line
// per case, "<case>: <exception type>: <message>". `refusals CONFIG` runs every case on a fresh
// writer of its own dataset, the engine chosen in code (SetEngine, SetParameters) rather than XML.
#include <adios2.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

static int cases = 0;

static void Case(const char *config, const char *name, const std::function<void(adios2::IO &, adios2::Engine &)> &f)
{
    try
    {
        adios2::ADIOS adios;
        adios2::IO io = adios.DeclareIO("refuse");
        io.SetEngine("Plugin");
        io.SetParameters({{"PluginName", "cairn"}, {"PluginLibrary", "cairn_adios2"}, {"Config", config},
                          {"Name", "refuse" + std::to_string(cases++)}});
        adios2::Engine w = io.Open("refuse.bp", adios2::Mode::Write);
        w.BeginStep();
        f(io, w);
        w.EndStep();
        w.Close();
        std::printf("%s: accepted\n", name);
    }
    catch (const std::invalid_argument &e)
    {
        std::printf("%s: invalid_argument: %s\n", name, e.what());
    }
    catch (const std::exception &e)
    {
        std::printf("%s: other: %s\n", name, e.what());
    }
    std::fflush(stdout);
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    const char *xml = argv[1]; // the config
    std::vector<double> data(16, 1.0);
    Case(xml, "string", [](adios2::IO &io, adios2::Engine &w) {
        auto v = io.DefineVariable<std::string>("label");
        w.Put(v, std::string("x"));
    });
    Case(xml, "long double", [](adios2::IO &io, adios2::Engine &w) {
        auto v = io.DefineVariable<long double>("ld", {4}, {0}, {4});
        std::vector<long double> d(4, 1.0L);
        w.Put(v, d.data(), adios2::Mode::Sync);
    });
    Case(xml, "operator", [&](adios2::IO &io, adios2::Engine &w) {
        auto v = io.DefineVariable<double>("squeezed", {16}, {0}, {16});
        v.AddOperation("null", {});
        w.Put(v, data.data(), adios2::Mode::Sync);
    });
    Case(xml, "joined", [&](adios2::IO &io, adios2::Engine &w) {
        auto v = io.DefineVariable<double>("table", {adios2::JoinedDim, 4}, {}, {4, 4});
        w.Put(v, data.data(), adios2::Mode::Sync);
    });
    Case(xml, "memory selection", [&](adios2::IO &io, adios2::Engine &w) {
        auto v = io.DefineVariable<double>("ghosted", {2, 2}, {0, 0}, {2, 2});
        v.SetMemorySelection({{1, 1}, {4, 4}});
        w.Put(v, data.data(), adios2::Mode::Sync);
    });
    Case(xml, "plain", [&](adios2::IO &io, adios2::Engine &w) {
        auto v = io.DefineVariable<double>("fine", {16}, {0}, {16});
        w.Put(v, data.data(), adios2::Mode::Sync);
    });
    // A get into a memory selection, from the dataset "plain" wrote.
    try
    {
        adios2::ADIOS adios;
        adios2::IO io = adios.DeclareIO("refuse");
        io.SetEngine("Plugin");
        io.SetParameters({{"PluginName", "cairn"}, {"PluginLibrary", "cairn_adios2"}, {"Config", xml},
                          {"Name", "refuse" + std::to_string(cases - 1)}});
        adios2::Engine r = io.Open("refuse.bp", adios2::Mode::Read);
        r.BeginStep();
        auto v = io.InquireVariable<double>("fine");
        v.SetSelection({{0}, {4}});
        v.SetMemorySelection({{2}, {8}});
        std::vector<double> out(8);
        r.Get(v, out.data(), adios2::Mode::Sync);
        std::printf("get memory selection: accepted\n");
    }
    catch (const std::invalid_argument &e)
    {
        std::printf("get memory selection: invalid_argument: %s\n", e.what());
    }
    std::fflush(stdout);
    return 0;
}
