/* Starts a local staging cluster from C (no Python), writes two steps of a 2-D field into it,
 * reads a box back, and stops the cluster.
 * Build: cc embedded.c -I../../crates/cairn-capi/include -L../../target/release -lcairn
 * Run:   CAIRN_SERVER=../../target/release/cairn-server ./embedded DIR
 *        (the server binary is found via $CAIRN_SERVER, beside the program, or on PATH) */
#include <stdio.h>
#include <stdlib.h>
#include "cairn.h"

enum { NX = 300, NY = 200 };

#define CHECK(call)                                                        \
  do {                                                                     \
    if ((call) != CAIRN_OK) {                                              \
      fprintf(stderr, "%s failed: %s\n", #call, cairn_last_error());       \
      exit(1);                                                             \
    }                                                                      \
  } while (0)

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : ".";
  char cluster[4096], config[4096];
  snprintf(cluster, sizeof cluster, "%s/cluster.json", dir);
  snprintf(config, sizeof config, "%s/cairn.toml", dir);
  CHECK(cairn_cluster_start(cluster, 2, "64MiB"));
  FILE *toml = fopen(config, "w");
  fprintf(toml, "engine = \"staging\"\n[staging]\ncluster = \"%s\"\nobject_size = 65536\n", cluster);
  fclose(toml);

  uint64_t shape[2] = {NX, NY}, offset[2] = {0, 0};
  double *field = malloc(sizeof(double) * NX * NY);
  cairn_file *w = NULL;
  CHECK(cairn_open("embedded", "w", config, 0, 1, &w));
  CHECK(cairn_define(w, "u", "f8", 2, shape));
  for (uint64_t s = 0; s < 2; s++) {
    for (uint64_t i = 0; i < (uint64_t)NX * NY; i++) field[i] = (double)(s * 1000000 + i);
    CHECK(cairn_begin_step(w, s));
    CHECK(cairn_put(w, "u", field, 2, offset, shape));
    CHECK(cairn_end_step(w));
  }
  CHECK(cairn_close(w));

  uint64_t boff[2] = {100, 50}, bcnt[2] = {150, 20};
  double *out = malloc(sizeof(double) * 150 * 20);
  cairn_file *r = NULL;
  CHECK(cairn_open("embedded", "r", config, 0, 1, &r));
  CHECK(cairn_get(r, "u", 1, 2, boff, bcnt, out, sizeof(double) * 150 * 20));
  for (uint64_t i = 0; i < 150; i++)
    for (uint64_t j = 0; j < 20; j++)
      if (out[i * 20 + j] != (double)(1000000 + (100 + i) * NY + 50 + j)) {
        fprintf(stderr, "mismatch at (%lu, %lu)\n", (unsigned long)i, (unsigned long)j);
        return 2;
      }
  CHECK(cairn_close(r));
  CHECK(cairn_cluster_stop(cluster));
  printf("C embedded cluster: wrote 2 steps, verified a box, stopped the cluster\n");
  free(field);
  free(out);
  return 0;
}
