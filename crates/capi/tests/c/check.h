/*
 * CHECK(cond), shared by the C test programs here: a failed condition
 * prints where, the condition and errno, and exits 1, so the Rust harness
 * sees a failure with its cause.
 */
#ifndef EUDP_TEST_CHECK_H
#define EUDP_TEST_CHECK_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond)                                                              \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "%s:%d: check failed: %s (errno %d: %s)\n",          \
                    __FILE__, __LINE__, #cond, errno, strerror(errno));          \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

#endif
