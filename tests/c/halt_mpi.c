/* Ranks opened with cairn_open_mpi ask cairn_halt_requested_all every step (an allreduce over the
 * communicator): the halt file appears while they run, and every rank stops before the same step,
 * none left waiting in the next. Each rank writes the step it stopped before to OUT.stop.RANK. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cairn.h"

#define CHECK(call)                                                                         \
  do {                                                                                      \
    if ((call) != CAIRN_OK) {                                                               \
      fprintf(stderr, "rank %d: %s failed: %s\n", rank, #call, cairn_last_error());         \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                         \
    }                                                                                       \
  } while (0)

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc != 2) {
    fprintf(stderr, "usage: halt_mpi OUT\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  cairn_file *f = NULL;
  CHECK(cairn_open_mpi("h", "w", NULL, MPI_Comm_c2f(MPI_COMM_WORLD), &f));
  uint64_t shape[1] = {(uint64_t)size}, offset[1] = {(uint64_t)rank}, count[1] = {1};
  CHECK(cairn_define(f, "t", "f8", 1, shape));
  uint64_t step = 0;
  int halt = 0;
  for (;;) {
    CHECK(cairn_halt_requested_all(f, &halt));
    if (halt) break;
    double v = (double)step;
    CHECK(cairn_begin_step(f, step));
    CHECK(cairn_put(f, "t", &v, 1, offset, count));
    CHECK(cairn_end_step(f));
    step++;
    usleep(5000 * (rank + 1)); /* ranks ask at different moments */
    if (step == 5000) {
      fprintf(stderr, "rank %d: never halted\n", rank);
      MPI_Abort(MPI_COMM_WORLD, 3);
    }
  }
  CHECK(cairn_close(f));
  char path[4096];
  snprintf(path, sizeof path, "%s.stop.%d", argv[1], rank);
  FILE *out = fopen(path, "w");
  if (out == NULL) MPI_Abort(MPI_COMM_WORLD, 4);
  fprintf(out, "%llu", (unsigned long long)step);
  fclose(out);
  MPI_Finalize();
  return 0;
}
