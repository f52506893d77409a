/* D²T claims and consume from C (issue 44): cairn_claims_open/next/close hand each committed step
 * of "src" to one claimer; a claimer that gives a step back (closes without consuming) hands it to
 * the other; cairn_consume commits the result into "dst" and releases the source step in one
 * transaction, refused (CONFLICT) once the step was consumed. Also cairn_open_mpi in a program
 * without MPI: a clear CONFIG error.
 * Usage: claims CAIRN_TOML; prints "C claims: ok" or the failed check. */
#include <stdio.h>
#include <string.h>
#include "check.h"

enum { STEPS = 6 };

/* Writes the result of source step `s` into `dst`, consuming it. */
static enum cairn_status produce(struct cairn_file *dst, struct cairn_file *src, uint64_t s) {
  const uint64_t origin[1] = {0}, count[1] = {4};
  const char *sources[1] = {"src"};
  double a[4], b[4];
  enum cairn_status st = cairn_get(src, "a", s, 1, origin, count, a, sizeof a);
  for (int i = 0; i < 4; i++) b[i] = 2 * a[i];
  if (st == CAIRN_OK) st = cairn_begin_step(dst, s);
  if (st == CAIRN_OK) st = cairn_put(dst, "b", b, 1, origin, count);
  if (st == CAIRN_OK) st = cairn_consume(dst, sources, 1);
  if (st == CAIRN_OK) return cairn_end_step(dst);
  return st;
}

int main(int argc, char **argv) {
  const char *config = argc > 1 ? argv[1] : NULL;
  struct cairn_file *w = NULL, *src = NULL, *dst = NULL, *late = NULL, *none = NULL;
  struct cairn_claims *one = NULL, *two = NULL;
  const uint64_t shape[1] = {4}, origin[1] = {0};
  uint64_t step = 0, first = 0;
  int got = 0, seen[STEPS] = {0};

  EXPECT(cairn_open_mpi("src", "w", config, 0, &none) == CAIRN_ERR_CONFIG);
  EXPECT(strstr(cairn_last_error(), "MPI") != NULL);
  EXPECT(strcmp(cairn_last_error_code(), "") == 0); /* a failure with no typed reason */

  CHECK(cairn_open("src", "w", config, 0, 1, &w));
  CHECK(cairn_define(w, "a", "f8", 1, shape));
  for (uint64_t s = 0; s < STEPS; s++) {
    double a[4] = {s, s + 0.25, s + 0.5, s + 0.75};
    CHECK(cairn_begin_step(w, s));
    CHECK(cairn_put(w, "a", a, 1, origin, shape));
    CHECK(cairn_end_step(w));
  }
  CHECK(cairn_close(w)); /* closed: claimers end once nothing is left */

  CHECK(cairn_open("src", "r", config, 0, 1, &src));
  CHECK(cairn_open("dst", "w", config, 0, 1, &dst));
  CHECK(cairn_define(dst, "b", "f8", 1, shape));
  EXPECT(cairn_claims_open(src, 0.0, &one) == CAIRN_ERR_INVALID_ARGUMENT);
  CHECK(cairn_claims_open(src, 30.0, &one));
  CHECK(cairn_claims_open(src, 30.0, &two));

  /* Two claimers never hold the same step; the one given back goes to the other. */
  CHECK(cairn_claims_next(one, 10.0, &first, &got));
  EXPECT(got == 1 && first == 0);
  CHECK(cairn_claims_next(two, 10.0, &step, &got));
  EXPECT(got == 1 && step == 1);
  CHECK(cairn_claims_close(two));
  CHECK(produce(dst, src, first));
  seen[first] = 1;
  while (1) {
    CHECK(cairn_claims_next(one, 10.0, &step, &got));
    if (!got) break;
    EXPECT(step < STEPS && !seen[step]);
    CHECK(produce(dst, src, step));
    seen[step] = 1;
  }
  for (int s = 0; s < STEPS; s++) EXPECT(seen[s]);
  CHECK(cairn_claims_close(one));

  /* The source step is gone with its consumption: a second consumer of step 0 is refused. */
  CHECK(cairn_open("late", "w", config, 0, 1, &late));
  CHECK(cairn_define(late, "b", "f8", 1, shape));
  CHECK(cairn_begin_step(late, 0));
  const char *sources[1] = {"src"};
  enum cairn_status st = cairn_consume(late, sources, 1);
  if (st == CAIRN_OK) st = cairn_end_step(late);
  EXPECT(st == CAIRN_ERR_CONFLICT || st == CAIRN_ERR_NOT_FOUND);
  EXPECT(cairn_consume(late, NULL, 0) == CAIRN_ERR_INVALID_ARGUMENT);
  CHECK(cairn_abort_step(late));
  CHECK(cairn_close(late));
  CHECK(cairn_close(dst));
  CHECK(cairn_close(src));
  printf("C claims: ok\n");
  return 0;
}
