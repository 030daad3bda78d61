/* The entry of autodiff.c, which program.c calls when it builds a program: the backward
 * programs of every stage from the forward ones. Its own header, so that program_impl.h
 * (what the program's files share) declares nothing of autodiff.c. */
#ifndef STARPIPE_GRAPH_AUTODIFF_H
#define STARPIPE_GRAPH_AUTODIFF_H

#include "graph/program_impl.h"

/* Emits B, W and BW of every stage of p (its forward programs built). SP_OK or an error. */
sp_status sp_autodiff_emit(sp_program *p);

#endif
