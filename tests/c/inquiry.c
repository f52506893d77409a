/* The C API beyond put and get (issue 44): cairn_define_ex (dims, attributes, constant),
 * cairn_set_attrs, cairn_attrs, cairn_steps, cairn_wait_step, cairn_var_info, cairn_blocks,
 * cairn_get_local, cairn_release.
 * Usage: inquiry CAIRN_TOML; prints "C inquiry: ok" or the failed check. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"

int main(int argc, char **argv) {
  const char *config = argc > 1 ? argv[1] : NULL;
  struct cairn_file *w = NULL, *r = NULL;
  const uint64_t shape[2] = {2, 3}, x_shape[1] = {3}, origin[2] = {0, 0};
  const char *dims[2] = {"y", "x"}, *x_dims[1] = {"x"};
  double field[6], x[3] = {0.0, 0.5, 1.0}, walkers[4];
  CHECK(cairn_open("inq", "w", config, 0, 1, &w));
  CHECK(cairn_set_attrs(w, "{\"title\": \"from C\"}"));
  CHECK(cairn_define_ex(w, "u", "f8", 2, shape, dims, "{\"units\": \"K\"}", 0));
  CHECK(cairn_define_ex(w, "x", "f8", 1, x_shape, x_dims, "{\"units\": \"m\"}", 1));
  CHECK(cairn_define(w, "walkers", "f8", -1, NULL));
  EXPECT(cairn_define_ex(w, "bad", "f8", 1, x_shape, x_dims, "not json", 0) == CAIRN_ERR_INVALID_ARGUMENT);
  /* Only -1 (local) and 0..CAIRN_MAX_DIMS dimensions, and no shape past 2^64 bytes (issue 52). */
  const uint64_t huge[2] = {(uint64_t)1 << 62, (uint64_t)1 << 62}, wide[1] = {(uint64_t)1 << 62};
  EXPECT(cairn_define(w, "neg", "f8", -2, shape) == CAIRN_ERR_INVALID_ARGUMENT);
  EXPECT(strstr(cairn_last_error(), "ndim -2") != NULL);
  EXPECT(cairn_define(w, "deep", "f8", CAIRN_MAX_DIMS + 1, shape) == CAIRN_ERR_INVALID_ARGUMENT);
  EXPECT(cairn_define(w, "huge", "f8", 2, huge) == CAIRN_ERR_INVALID_ARGUMENT);
  EXPECT(strstr(cairn_last_error(), "2^64") != NULL);
  EXPECT(cairn_define(w, "wide", "f8", 1, wide) == CAIRN_ERR_INVALID_ARGUMENT);
  for (uint64_t s = 0; s < 3; s++) {
    for (int i = 0; i < 6; i++) field[i] = 100.0 * s + i;
    for (int i = 0; i < 4; i++) walkers[i] = s + 0.25 * i;
    uint64_t nw = 4;
    CHECK(cairn_begin_step(w, s));
    CHECK(cairn_put(w, "u", field, 2, origin, shape));
    if (s == 0) CHECK(cairn_put(w, "x", x, 1, origin, x_shape));
    CHECK(cairn_put_typed(w, "walkers", "f8", walkers, 1, NULL, &nw));
    EXPECT(cairn_put_typed(w, "u", "f4", field, 2, origin, shape) == CAIRN_ERR_INVALID_ARGUMENT);
    CHECK(cairn_end_step(w));
  }
  CHECK(cairn_close(w));

  CHECK(cairn_open("inq", "r", config, 0, 1, &r));
  uint64_t steps[8];
  size_t n = 0;
  CHECK(cairn_steps(r, steps, 8, &n));
  EXPECT(n == 3 && steps[0] == 0 && steps[2] == 2);
  EXPECT(cairn_steps(r, NULL, 0, NULL) == CAIRN_ERR_INVALID_ARGUMENT);
  int committed = -1;
  CHECK(cairn_wait_step(r, 2, 0.0, &committed));
  EXPECT(committed == 1);
  CHECK(cairn_wait_step(r, 7, 0.05, &committed));
  EXPECT(committed == 0);
  char dtype[8];
  int ndim = 0, constant = -1;
  uint64_t ext[32];
  CHECK(cairn_var_info(r, "u", 1, dtype, &ndim, ext, &constant));
  EXPECT(strcmp(dtype, "f8") == 0 && ndim == 2 && ext[0] == 2 && ext[1] == 3 && constant == 0);
  CHECK(cairn_var_info(r, "x", 1, dtype, &ndim, ext, &constant));
  EXPECT(ndim == 1 && ext[0] == 3 && constant == 1);
  CHECK(cairn_var_info(r, "walkers", 1, dtype, &ndim, ext, &constant));
  EXPECT(ndim == -1);
  EXPECT(cairn_var_info(r, "nope", 1, dtype, &ndim, ext, &constant) == CAIRN_ERR_NOT_FOUND);
  struct cairn_block blocks[4];
  CHECK(cairn_blocks(r, "u", 2, blocks, 4, &n));
  EXPECT(n == 1 && blocks[0].writer == 0 && blocks[0].ndim == 2 && blocks[0].count[0] == 2 && blocks[0].count[1] == 3);
  EXPECT(blocks[0].min == 200.0 && blocks[0].max == 205.0 && blocks[0].mean == 202.5);
  CHECK(cairn_blocks(r, "u", 2, NULL, 0, &n));
  EXPECT(n == 1);
  char json[256];
  size_t len = 0;
  CHECK(cairn_attrs(r, NULL, 0, json, sizeof json, &len));
  EXPECT(strcmp(json, "{\"title\":\"from C\"}") == 0 && len == strlen(json));
  CHECK(cairn_attrs(r, "u", 1, NULL, 0, &len));
  EXPECT(len == strlen("{\"units\":\"K\"}"));
  CHECK(cairn_attrs(r, "u", 1, json, sizeof json, &len));
  EXPECT(strcmp(json, "{\"units\":\"K\"}") == 0);
  uint64_t at = 99;
  CHECK(cairn_constant_step(r, "x", &at));
  EXPECT(at == 0);
  double got[4];
  CHECK(cairn_get_local(r, "walkers", 2, 0, got, sizeof got));
  EXPECT(got[3] == 2.75);
  CHECK(cairn_release(r, 1));
  CHECK(cairn_steps(r, NULL, 0, &n));
  EXPECT(n == 2);
  CHECK(cairn_close(r));
  printf("C inquiry: ok\n");
  return 0;
}
