/* Writes a 3-D field from every MPI rank, step after step, through Cairn.
 * The engine comes from cairn.toml ($CAIRN_CONFIG); the code does not change between engines.
 * cairn_open_mpi takes the communicator: with the file engine the ranks of a node share one data
 * file (N→M aggregation) and commit each step together, as Python's comm= does.
 * Build: mpicc write3d.c -I../../crates/cairn-capi/include -L../../target/release -lcairn
 * Run:   mpirun -n 4 ./write3d [name] [steps]
 * Value at (i, j, k) of step s: s * 1e6 + (i * NY + j) * NZ + k, so any reader can check it.
 * Each rank also traces (rank + s) % 3 "energy" records per step: rank * 100 + s * 10 + r. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include "cairn.h"

enum { NX = 101, NY = 64, NZ = 48 };

#define CHECK(call)                                                              \
  do {                                                                           \
    if ((call) != CAIRN_OK) {                                                    \
      fprintf(stderr, "rank %d: %s failed: %s\n", rank, #call, cairn_last_error()); \
      MPI_Abort(MPI_COMM_WORLD, 1);                                              \
    }                                                                            \
  } while (0)

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, nranks;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  const char *name = argc > 1 ? argv[1] : "field3d";
  int steps = argc > 2 ? atoi(argv[2]) : 5;

  /* Irregular slabs along x: 101 rows over nranks ranks. */
  uint64_t x0 = (uint64_t)rank * NX / nranks, x1 = (uint64_t)(rank + 1) * NX / nranks;
  uint64_t shape[3] = {NX, NY, NZ}, offset[3] = {x0, 0, 0}, count[3] = {x1 - x0, NY, NZ};
  double *block = malloc(sizeof(double) * count[0] * NY * NZ);

  cairn_file *f = NULL;
  CHECK(cairn_open_mpi(name, "w", NULL, MPI_Comm_c2f(MPI_COMM_WORLD), &f));
  CHECK(cairn_define(f, "temperature", "f8", 3, shape));
  for (int s = 0; s < steps; s++) {
    for (uint64_t i = 0; i < count[0]; i++)
      for (uint64_t j = 0; j < NY; j++)
        for (uint64_t k = 0; k < NZ; k++)
          block[(i * NY + j) * NZ + k] = s * 1e6 + (double)(((x0 + i) * NY + j) * NZ + k);
    CHECK(cairn_begin_step(f, (uint64_t)s));
    CHECK(cairn_put(f, "temperature", block, 3, offset, count));
    double energy[2];
    uint64_t n = (uint64_t)((rank + s) % 3);
    for (uint64_t r = 0; r < n; r++) energy[r] = rank * 100 + s * 10 + (double)r;
    if (n > 0) CHECK(cairn_trace(f, "energy", "f8", energy, 1, &n));
    CHECK(cairn_end_step(f));
  }
  CHECK(cairn_close(f)); /* collective: every rank's steps are committed when it returns */

  /* Rank 0 reads a box that spans every writer's slab back through the C API. */
  if (rank == 0) {
    uint64_t boff[3] = {10, 5, 7}, bcnt[3] = {80, 3, 2};
    double out[80 * 3 * 2];
    cairn_file *r = NULL;
    CHECK(cairn_open(name, "r", NULL, 0, 1, &r));
    CHECK(cairn_get(r, "temperature", (uint64_t)(steps - 1), 3, boff, bcnt, out, sizeof out));
    for (uint64_t i = 0; i < 80; i++)
      for (uint64_t j = 0; j < 3; j++)
        for (uint64_t k = 0; k < 2; k++) {
          double want = (steps - 1) * 1e6 + (double)(((10 + i) * NY + 5 + j) * NZ + 7 + k);
          if (out[(i * 3 + j) * 2 + k] != want) {
            fprintf(stderr, "mismatch at (%lu,%lu,%lu)\n", (unsigned long)i, (unsigned long)j, (unsigned long)k);
            MPI_Abort(MPI_COMM_WORLD, 2);
          }
        }
    /* Errors name the problem: a box outside the global shape. */
    uint64_t bad[3] = {100, 0, 0}, bcnt2[3] = {2, 1, 1};
    if (cairn_get(r, "temperature", 0, 3, bad, bcnt2, out, 2 * sizeof(double)) != CAIRN_ERR_INVALID_ARGUMENT) {
      fprintf(stderr, "out-of-bounds box was not refused\n");
      MPI_Abort(MPI_COMM_WORLD, 3);
    }
    printf("C writer: %d ranks wrote %d steps of %dx%dx%d; C reader verified a box (error check: %s)\n",
           nranks, steps, NX, NY, NZ, cairn_last_error());
    CHECK(cairn_close(r));
  }
  free(block);
  MPI_Finalize();
  return 0;
}
