// A heat-transfer-like ADIOS2 program, written against the serial ADIOS2 API and unaware of Cairn:
// `heat write XML NY NX STEPS` writes a 2-D field T over a process grid (MPI only for its rank and
// grid), `heat read XML Y0 X0 NY NX` reads that box of every step, and the blocks' BlocksInfo.
// The engine is whatever XML's IO "heat" says (BP5, or the Cairn plugin).
#include <adios2.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

static double Value(size_t step, size_t y, size_t x, size_t nx) { return step * 1000.0 + y * nx + x + 0.5; }

static int Write(const char *xml, size_t ny, size_t nx, size_t steps)
{
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int py = 1;
    for (int d = 1; d * d <= size; ++d)
        if (size % d == 0) py = d;
    const int px = size / py;
    const size_t by = ny / py, bx = nx / px;
    const size_t y0 = (rank / px) * by, x0 = (rank % px) * bx;
    const size_t cy = (rank / px == py - 1) ? ny - y0 : by, cx = (rank % px == px - 1) ? nx - x0 : bx;

    adios2::ADIOS adios(xml);
    adios2::IO io = adios.DeclareIO("heat");
    auto T = io.DefineVariable<double>("T", {ny, nx}, {y0, x0}, {cy, cx});
    auto it = io.DefineVariable<int32_t>("iteration");
    io.DefineAttribute<std::string>("description", "temperature field");
    io.DefineAttribute<std::string>("units", "K", "T");
    io.DefineAttribute<double>("dt", 0.25);
    adios2::Engine w = io.Open("heat.bp", adios2::Mode::Write);
    std::vector<double> field(cy * cx);
    for (size_t s = 0; s < steps; ++s)
    {
        for (size_t y = 0; y < cy; ++y)
            for (size_t x = 0; x < cx; ++x) field[y * cx + x] = Value(s, y0 + y, x0 + x, nx);
        w.BeginStep();
        w.Put(T, field.data()); // deferred: the buffer is read at EndStep
        w.Put(it, static_cast<int32_t>(s));
        w.EndStep();
    }
    w.Close();
    if (rank == 0) std::printf("heat: wrote %zu steps from %d ranks\n", steps, size);
    return 0;
}

static int Read(const char *xml, size_t y0, size_t x0, size_t ny, size_t nx)
{
    adios2::ADIOS adios(xml);
    adios2::IO io = adios.DeclareIO("heat");
    adios2::Engine r = io.Open("heat.bp", adios2::Mode::Read);
    while (r.BeginStep(adios2::StepMode::Read, 30.0f) == adios2::StepStatus::OK)
    {
        auto T = io.InquireVariable<double>("T");
        auto it = io.InquireVariable<int32_t>("iteration");
        const auto shape = T.Shape();
        T.SetSelection({{y0, x0}, {ny, nx}});
        std::vector<double> box(ny * nx);
        int32_t iteration = -1;
        r.Get(T, box.data(), adios2::Mode::Deferred);
        r.Get(it, iteration);
        r.PerformGets();
        bool exact = true;
        double sum = 0;
        for (size_t y = 0; y < ny; ++y)
            for (size_t x = 0; x < nx; ++x)
            {
                sum += box[y * nx + x];
                exact &= box[y * nx + x] == Value(iteration, y0 + y, x0 + x, shape[1]);
            }
        // Every block's statistics describe its data.
        const auto blocks = r.BlocksInfo(T, r.CurrentStep());
        bool stats = !blocks.empty();
        for (size_t b = 0; b < blocks.size(); ++b)
        {
            const auto &info = blocks[b];
            std::vector<double> data(info.Count[0] * info.Count[1]);
            T.SetBlockSelection(b);
            r.Get(T, data.data(), adios2::Mode::Sync);
            double lo = data[0], hi = data[0];
            for (double v : data) lo = std::min(lo, v), hi = std::max(hi, v);
            stats &= lo == info.Min && hi == info.Max && data[0] == Value(iteration, info.Start[0], info.Start[1], shape[1]);
        }
        const auto desc = io.InquireAttribute<std::string>("description");
        const auto units = io.InquireAttribute<std::string>("units", "T");
        r.EndStep();
        std::printf("step %d shape %zux%zu sum %.1f exact %d blocks %zu stats %d attrs %s/%s\n", iteration, shape[0], shape[1], sum,
                    exact, blocks.size(), stats, desc ? desc.Data()[0].c_str() : "-", units ? units.Data()[0].c_str() : "-");
    }
    r.Close();
    return 0;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rc = 2;
    try
    {
        const std::string what = argc > 1 ? argv[1] : "";
        if (what == "write" && argc == 6)
            rc = Write(argv[2], std::atol(argv[3]), std::atol(argv[4]), std::atol(argv[5]));
        else if (what == "read" && argc == 7)
            rc = Read(argv[2], std::atol(argv[3]), std::atol(argv[4]), std::atol(argv[5]), std::atol(argv[6]));
        else
            std::fprintf(stderr, "usage: heat write XML NY NX STEPS | heat read XML Y0 X0 NY NX\n");
    }
    catch (const std::exception &e)
    {
        std::fprintf(stderr, "heat: %s\n", e.what());
        rc = 1;
    }
    MPI_Finalize();
    return rc;
}
