/* starpipe-plan --search: runs the layout search (starpipe/search.h) on what
 * starpipe-plan.c parsed, prints the best layouts, and writes the best as an apps command
 * line and a schedule file. */
#ifndef STARPIPE_APPS_PLAN_SEARCH_H
#define STARPIPE_APPS_PLAN_SEARCH_H

#include "starpipe/search.h"

typedef struct {
    sp_search_config cfg;   /* model, devices, global batch, device, limits */
    const char *save;       /* --save-schedule FILE, or NULL */
} plan_search_args;

/* The exit code: 0, 1 for bad input, 2 when no layout exists or fits (one message). */
int plan_search(const plan_search_args *a);

#endif
