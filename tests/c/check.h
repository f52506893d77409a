/* The C tests' checks: CHECK(call) fails the test (exit 1) naming the call and cairn_last_error();
 * EXPECT(cond) fails it naming the condition. */
#ifndef CAIRN_TEST_CHECK_H
#define CAIRN_TEST_CHECK_H
#include <stdio.h>
#include "cairn.h"

#define CHECK(call)                                                           \
  do {                                                                        \
    enum cairn_status s_ = (call);                                            \
    if (s_ != CAIRN_OK) {                                                     \
      fprintf(stderr, "%s failed (%d): %s\n", #call, s_, cairn_last_error()); \
      return 1;                                                               \
    }                                                                         \
  } while (0)
#define EXPECT(cond)                                \
  do {                                              \
    if (!(cond)) {                                  \
      fprintf(stderr, "check failed: %s\n", #cond); \
      return 1;                                     \
    }                                               \
  } while (0)

#endif
