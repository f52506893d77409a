/* The C functions the ADIOS2 plugin engine needs, tested through the C API: cairn_open_overrides
 * (settings winning over the config), cairn_step_vars and cairn_step_attrs (a step's variables
 * and dataset attributes) and cairn_stream_state (newest step, whether the writers closed). argv[1]: a config naming a
 * staging engine that the override "engine=file" and "path=argv[2]" replace. */
#include <stdint.h>
#include <string.h>
#include "check.h"

int main(int argc, char **argv) {
  if (argc != 3) return 2;
  char overrides[512];
  snprintf(overrides, sizeof overrides, "engine=file\npath=%s\n", argv[2]);
  cairn_file *w = NULL, *r = NULL;
  CHECK(cairn_open_overrides("inq", "w", argv[1], overrides, 0, 1, &w));
  uint64_t shape[2] = {2, 3}, offset[2] = {0, 0};
  double u[6] = {1, 2, 3, 4, 5, 6};
  int64_t n = 7;
  CHECK(cairn_define(w, "u", "f8", 2, shape));
  CHECK(cairn_define(w, "n", "i8", 0, NULL));
  CHECK(cairn_open_overrides("inq", "r", argv[1], overrides, 0, 1, &r));
  uint64_t newest = 99;
  int any = 1, closed = 1;
  CHECK(cairn_stream_state(r, &newest, &any, &closed));
  EXPECT(any == 0 && closed == 0);
  CHECK(cairn_set_attr(w, NULL, "title", "\"one\""));
  CHECK(cairn_begin_step(w, 0));
  CHECK(cairn_put(w, "u", u, 2, offset, shape));
  CHECK(cairn_put(w, "n", &n, 0, offset, shape));
  CHECK(cairn_end_step(w));
  CHECK(cairn_stream_state(r, &newest, &any, &closed));
  EXPECT(any == 1 && newest == 0 && closed == 0);
  size_t len = 0;
  CHECK(cairn_step_vars(r, 0, NULL, 0, &len));
  EXPECT(len == strlen("n\nu"));
  char names[8];
  CHECK(cairn_step_vars(r, 0, names, sizeof names, &len));
  EXPECT(strcmp(names, "n\nu") == 0);
  EXPECT(cairn_step_vars(r, 5, names, sizeof names, &len) == CAIRN_ERR_NOT_FOUND);
  CHECK(cairn_set_attr(w, NULL, "title", "\"two\""));
  CHECK(cairn_begin_step(w, 1));
  CHECK(cairn_end_step(w));
  char attrs[64];
  CHECK(cairn_step_attrs(r, 0, attrs, sizeof attrs, &len));
  EXPECT(strcmp(attrs, "{\"title\":\"one\"}") == 0);
  CHECK(cairn_step_attrs(r, 1, attrs, sizeof attrs, &len));
  EXPECT(strcmp(attrs, "{\"title\":\"two\"}") == 0 && len == strlen(attrs));
  CHECK(cairn_close(w));
  CHECK(cairn_stream_state(r, &newest, &any, &closed));
  EXPECT(any == 1 && newest == 1 && closed == 1);
  CHECK(cairn_close(r));
  EXPECT(cairn_open_overrides("inq", "r", argv[1], "engine", 0, 1, &r) == CAIRN_ERR_INVALID_ARGUMENT);
  EXPECT(strstr(cairn_last_error(), "key=value") != NULL);
  printf("C stream inquiry: ok\n");
  return 0;
}
