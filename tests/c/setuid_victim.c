/* The victim of the exec attack (issue 52, tests/test_socket_access.py): installed setuid root,
 * it reads a root-only file into memory, prints "ADDR LEN" of that copy, waits for a line on
 * stdin and prints "intact" if the copy still equals the file ("changed" if not), then waits for
 * another line (or the end of stdin) before it exits.
 * Usage: setuid_victim FILE */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
  static char secret[4096], again[4096];
  FILE *f = argc > 1 ? fopen(argv[1], "rb") : NULL;
  if (!f) {
    printf("cannot read the secret (euid %d)\n", (int)geteuid());
    return 1;
  }
  size_t n = fread(secret, 1, sizeof secret, f);
  fclose(f);
  printf("%llu %zu\n", (unsigned long long)(uintptr_t)secret, n);
  fflush(stdout);
  char line[64];
  if (!fgets(line, sizeof line, stdin)) return 1;
  f = fopen(argv[1], "rb");
  size_t m = f ? fread(again, 1, sizeof again, f) : 0;
  if (f) fclose(f);
  printf("%s\n", m == n && memcmp(secret, again, n) == 0 ? "intact" : "changed");
  fflush(stdout);
  /* Exits only once the attacker printed its verdict: in a new pid namespace this program is
   * pid 1, whose exit kills the attacker. */
  if (!fgets(line, sizeof line, stdin)) return 0;
  return 0;
}
