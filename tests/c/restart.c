/* A restart in one handle (issue 56): settings given as TOML text, not a file; a first run writes
 * 3 steps; the restart opens "a", reads its state at cairn_next_step - 1 through the same handle
 * (cairn_steps, cairn_var_info, cairn_get) and writes the next step; cairn_halt_requested and
 * cairn_halt_requested_all say whether the job asks it to stop (-1 and CAIRN_ERR_CONFIG for a
 * variable that does not parse), and cairn_wait_drained that its newest step is on disk.
 * Usage: restart DIR; prints "C restart: resumed at 3, halt N" or the failed check. */
#include <stdio.h>
#include <string.h>
#include "check.h"

int main(int argc, char **argv) {
  char config[4096];
  snprintf(config, sizeof config, "engine = \"file\"\n[file]\npath = \"%s\"\n", argc > 1 ? argv[1] : ".");
  struct cairn_file *w = NULL, *a = NULL;
  const uint64_t shape[1] = {8}, origin[1] = {0};
  double state[8], back[8];
  CHECK(cairn_open("ckpt", "w", config, 0, 1, &w));
  CHECK(cairn_define(w, "state", "f8", 1, shape));
  for (uint64_t s = 0; s < 3; s++) {
    for (int i = 0; i < 8; i++) state[i] = 10.0 * s + i;
    CHECK(cairn_begin_step(w, s));
    CHECK(cairn_put(w, "state", state, 1, origin, shape));
    CHECK(cairn_end_step(w));
  }
  CHECK(cairn_close(w));

  CHECK(cairn_open("ckpt", "a", config, 0, 1, &a));
  uint64_t next = 0, steps[8];
  size_t n = 0;
  CHECK(cairn_next_step(a, &next));
  EXPECT(next == 3);
  CHECK(cairn_steps(a, steps, 8, &n));
  EXPECT(n == 3 && steps[2] == 2);
  char dtype[8];
  int ndim = 0, constant = 0;
  uint64_t extents[CAIRN_MAX_DIMS];
  CHECK(cairn_var_info(a, "state", next - 1, dtype, &ndim, extents, &constant));
  EXPECT(strcmp(dtype, "f8") == 0 && ndim == 1 && extents[0] == 8);
  CHECK(cairn_get(a, "state", next - 1, 1, origin, shape, back, sizeof back));
  for (int i = 0; i < 8; i++) EXPECT(back[i] == 20.0 + i);
  for (int i = 0; i < 8; i++) state[i] = back[i] + 1.0;
  CHECK(cairn_begin_step(a, next));
  CHECK(cairn_put(a, "state", state, 1, origin, shape));
  CHECK(cairn_end_step(a));
  CHECK(cairn_steps(a, steps, 8, &n));
  EXPECT(n == 4 && steps[3] == 3);
  /* A config that is neither a file nor TOML is a clear error. */
  struct cairn_file *bad = NULL;
  EXPECT(cairn_open("ckpt", "r", "engine = \"tape\"", 0, 1, &bad) == CAIRN_ERR_CONFIG);
  EXPECT(strstr(cairn_last_error(), "the config text") != NULL);
  int halt = cairn_halt_requested(), all = -1, drained = 0;
  if (halt < 0) {
    /* A variable that does not parse: named, and the same from the writer's agreed answer. */
    EXPECT(strstr(cairn_last_error(), "CAIRN_HALT_SECONDS") != NULL);
    EXPECT(cairn_halt_requested_all(a, &all) == CAIRN_ERR_CONFIG);
  } else {
    /* One rank: the agreed answer is this process's. */
    CHECK(cairn_halt_requested_all(a, &all));
    EXPECT(all == halt);
  }
  /* The file engine's steps are on disk once committed. */
  CHECK(cairn_wait_drained(a, -1, 5.0, &drained));
  EXPECT(drained == 1);
  CHECK(cairn_close(a));
  printf("C restart: resumed at %llu, halt %d\n", (unsigned long long)next, halt);
  return 0;
}
