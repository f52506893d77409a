// The adios2 benchmark's writer and reader (python -m cairn.bench adios2): the same steps of a 1-D
// float64 array through ADIOS2 (the engine its XML names: BP5, SST, the Cairn plugin) or through
// Cairn's own C API. A writer prints the seconds from its first BeginStep to its last EndStep
// returning; a reader reads every step whole into one buffer and prints how many it read whole.
//   stream_bench write adios2 XML STEPS MIB | write capi CONFIG NAME STEPS MIB
//   stream_bench read adios2 XML            | read capi CONFIG NAME STEPS
#include <adios2.h>

#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

extern "C" {
#include "cairn.h"
}

using Clock = std::chrono::steady_clock;

static double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

static void Check(cairn_status s, const char *what)
{
    if (s != CAIRN_OK)
    {
        std::fprintf(stderr, "%s: %s\n", what, cairn_last_error());
        std::exit(1);
    }
}

static int WriteAdios2(const char *xml, size_t steps, size_t n)
{
    adios2::ADIOS adios(xml);
    adios2::IO io = adios.DeclareIO("bench");
    auto x = io.DefineVariable<double>("x", {n}, {0}, {n});
    std::vector<double> data(n, 1.0);
    adios2::Engine w = io.Open("bench.bp", adios2::Mode::Write);
    Clock::time_point t0;
    for (size_t s = 0; s < steps; ++s)
    {
        data[0] = static_cast<double>(s);
        w.BeginStep();
        if (s == 0) t0 = Clock::now();
        w.Put(x, data.data());
        w.EndStep();
    }
    const double took = Since(t0);
    w.Close();
    std::printf("write_s %.6f\n", took);
    return 0;
}

static int WriteCapi(const char *config, const char *name, size_t steps, size_t n)
{
    cairn_file *w = nullptr;
    Check(cairn_open(name, "w", config, 0, 1, &w), "open");
    const uint64_t shape[1] = {n}, offset[1] = {0};
    Check(cairn_define(w, "x", "f8", 1, shape), "define");
    std::vector<double> data(n, 1.0);
    Clock::time_point t0;
    for (size_t s = 0; s < steps; ++s)
    {
        data[0] = static_cast<double>(s);
        Check(cairn_begin_step(w, s), "begin_step");
        if (s == 0) t0 = Clock::now();
        Check(cairn_put(w, "x", data.data(), 1, offset, shape), "put");
        Check(cairn_end_step(w), "end_step");
    }
    const double took = Since(t0);
    Check(cairn_close(w), "close");
    std::printf("write_s %.6f\n", took);
    return 0;
}

static int ReadAdios2(const char *xml)
{
    adios2::ADIOS adios(xml);
    adios2::IO io = adios.DeclareIO("bench");
    adios2::Engine r = io.Open("bench.bp", adios2::Mode::Read);
    std::vector<double> data;
    size_t whole = 0;
    for (size_t s = 0; r.BeginStep(adios2::StepMode::Read, 60.0f) == adios2::StepStatus::OK; ++s)
    {
        auto x = io.InquireVariable<double>("x");
        data.resize(x.Shape()[0]);
        r.Get(x, data.data(), adios2::Mode::Sync);
        r.EndStep();
        whole += data[0] == static_cast<double>(s) && data.back() == 1.0;
    }
    r.Close();
    std::printf("read_whole %zu\n", whole);
    return 0;
}

static int ReadCapi(const char *config, const char *name, size_t steps)
{
    cairn_file *r = nullptr;
    for (int tries = 0; cairn_open(name, "r", config, 0, 1, &r) != CAIRN_OK; ++tries)
    {
        if (tries > 600) Check(CAIRN_ERR_NOT_FOUND, "open");  // the file engine's dataset appears with the writer
        struct timespec ts = {0, 50000000};
        nanosleep(&ts, nullptr);
    }
    std::vector<double> data;
    size_t whole = 0;
    for (uint64_t s = 0; s < steps; ++s)
    {
        int committed = 0;
        while (!committed) Check(cairn_wait_step(r, s, 60.0, &committed), "wait_step");
        char dtype[8];
        int ndim = 0, constant = 0;
        uint64_t shape[CAIRN_MAX_DIMS];
        Check(cairn_var_info(r, "x", s, dtype, &ndim, shape, &constant), "var_info");
        data.resize(shape[0]);
        const uint64_t offset[1] = {0};
        Check(cairn_get(r, "x", s, 1, offset, shape, data.data(), data.size() * sizeof(double)), "get");
        whole += data[0] == static_cast<double>(s) && data.back() == 1.0;
    }
    Check(cairn_close(r), "close");
    std::printf("read_whole %zu\n", whole);
    return 0;
}

int main(int argc, char **argv)
{
    const std::string op = argc > 2 ? std::string(argv[1]) + " " + argv[2] : "";
    const size_t mib = 1 << 20;
    try
    {
        if (op == "write adios2" && argc == 6)
            return WriteAdios2(argv[3], std::atol(argv[4]), std::atol(argv[5]) * mib / sizeof(double));
        if (op == "write capi" && argc == 7)
            return WriteCapi(argv[3], argv[4], std::atol(argv[5]), std::atol(argv[6]) * mib / sizeof(double));
        if (op == "read adios2" && argc == 4)
            return ReadAdios2(argv[3]);
        if (op == "read capi" && argc == 6)
            return ReadCapi(argv[3], argv[4], std::atol(argv[5]));
    }
    catch (const std::exception &e)
    {
        std::fprintf(stderr, "stream_bench: %s\n", e.what());
        return 1;
    }
    std::fprintf(stderr, "usage: see the comment at the top of stream_bench.cpp\n");
    return 2;
}
