/* The apps' main() calls sp_app_main (apps/driver.c), which needs the StarPU runtime;
 * the command-line fuzz target never gets there, so it links this stand-in instead. */
#include <stdlib.h>

#include "apps/driver.h"

int sp_app_main(int argc, char **argv, sp_app_model *m)
{
    (void)argc, (void)argv, (void)m;
    abort(); /* never called: the fuzz target calls sp_app_parse only */
}
