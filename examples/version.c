/* Prints the library's version; with an argument, fails unless it matches. */
#include <stdio.h>
#include <string.h>
#include <torchcomm.h>

int main(int argc, char **argv) {
    int major, minor, patch;
    tc_result_t r = tc_get_version(&major, &minor, &patch);
    if (r != TC_SUCCESS) {
        fprintf(stderr, "tc_get_version: %s (%s)\n", tc_result_string(r), tc_last_error());
        return 1;
    }
    char text[64];
    snprintf(text, sizeof text, "%d.%d.%d", major, minor, patch);
    printf("libtorchcomm %s (header %d.%d.%d)\n", text, TC_VERSION_MAJOR, TC_VERSION_MINOR, TC_VERSION_PATCH);
    if (major != TC_VERSION_MAJOR || minor != TC_VERSION_MINOR || patch != TC_VERSION_PATCH) return 1;
    return argc > 1 && strcmp(argv[1], text) != 0;
}
