/* A client of another user than the servers' (issue 52, item 4): run as `nobody` against root's
 * servers with a copy of the cluster file, it writes a step of 512 KiB (a same-node put where
 * the servers allow other users' copies) and reads it back; with "read", it only reads a step
 * 0 of the same values someone else wrote (issue 55: root's shared segments are never mapped
 * for it).
 * Usage: other_user CAIRN_TOML [DATASET [read]]; prints "other user: ok" or the failed check. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"

#define N 65536

int main(int argc, char **argv) {
  const char *config = argc > 1 ? argv[1] : NULL, *name = argc > 2 ? argv[2] : "other";
  struct cairn_file *w = NULL, *r = NULL;
  const uint64_t shape[1] = {N}, origin[1] = {0};
  double *x = malloc(N * sizeof *x), *back = malloc(N * sizeof *back);
  for (int i = 0; i < N; i++) x[i] = 0.5 * i;
  if (!(argc > 3 && strcmp(argv[3], "read") == 0)) {
    CHECK(cairn_open(name, "w", config, 0, 1, &w));
    CHECK(cairn_define(w, "x", "f8", 1, shape));
    CHECK(cairn_begin_step(w, 0));
    CHECK(cairn_put(w, "x", x, 1, origin, shape));
    CHECK(cairn_end_step(w));
    CHECK(cairn_close(w));
  }
  CHECK(cairn_open(name, "r", config, 0, 1, &r));
  CHECK(cairn_get(r, "x", 0, 1, origin, shape, back, N * sizeof *back));
  for (int i = 0; i < N; i++) EXPECT(back[i] == x[i]);
  CHECK(cairn_close(r));
  printf("other user: ok\n");
  return 0;
}
