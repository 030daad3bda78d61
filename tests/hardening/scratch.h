/* A scratch folder for a hardening test: scratch_open("name") makes $TMPDIR/sp_hard_name_XXXXXX,
 * at("file") names a file in it (eight results stay valid at once), scratch_close()
 * removes it. Header-only, for test_paths.c and test_inputs.c. */
#ifndef SP_HARDENING_SCRATCH_H
#define SP_HARDENING_SCRATCH_H

#include <stdio.h>
#include <stdlib.h>

#include "tests/check.h"

static char dir[256];

static const char *at(const char *name) { return check_path(dir, name); }

static void scratch_open(const char *name)
{
    const char *base = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/sp_hard_%s_XXXXXX", base && *base ? base : "/tmp", name);
    REQUIRE(mkdtemp(dir), "mkdtemp");
}

static void scratch_close(void)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) {}
}

#endif
