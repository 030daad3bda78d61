/* starpipe: pipeline-parallel training on StarPU. This header includes the whole public
 * API. A complete program (run it with mpirun -np 2; STARPIPE_SCHEDULE picks the schedule):
 *
 *   #include <starpipe/starpipe.h>
 *   #include <stdio.h>
 *
 *   int main(int argc, char **argv)
 *   {
 *       sp_status st;
 *       sp_schedule *sch;
 *       if (sp_exec_init(&argc, &argv, NULL) ||                 // MPI + StarPU
 *           sp_schedule_from_env(NULL, sp_exec_size(), 0, 0, &sch))
 *           sp_exec_abort(1, "%s", sp_last_error());
 *       // the model, of one microbatch: y = argmax(x) to learn, one layer per stage
 *       sp_graph *g = sp_graph_create();
 *       sp_tensor x = sp_input_f32(g, "x", 2, (int64_t[]){ 16, 4 });
 *       sp_tensor y = sp_input_i32(g, "y", 1, (int64_t[]){ 16 });
 *       sp_tensor h = x;
 *       for (int s = 0; s < sch->nstages; s++) {
 *           if (s > 0) h = sp_pipeline_yield(g, h);              // stage s begins
 *           char name[16];
 *           snprintf(name, sizeof name, "w%d", s);
 *           sp_tensor w = sp_param(g, name, 2, (int64_t[]){ 4, 4 }, SP_INIT_NORMAL, 0.5f);
 *           h = sp_matmul(g, h, w, 0, 0);
 *       }
 *       sp_graph_set_loss(g, sp_cross_entropy(g, h, y));
 *       sp_program *prog = sp_program_build(g, &st);             // cut and differentiated
 *       sp_train_opts opts = { .seed = 1 };
 *       sp_adamw_defaults(&opts.opt);
 *       opts.opt.lr = 0.01f;
 *       sp_trainer *t = prog ? sp_trainer_create(prog, sch, &opts, &st) : NULL;
 *       if (!t) sp_exec_abort(1, "%s", sp_last_error());
 *       int m = sch->nmicro;                                     // microbatches per step
 *       float xs[m][16 * 4];
 *       int32_t ys[m][16];
 *       void *in[m * 2];                                         // [mb * ninputs + input]
 *       for (int step = 1; step <= 20; step++) {
 *           for (int mb = 0; mb < m; mb++) {
 *               for (int i = 0; i < 16; i++) {
 *                   ys[mb][i] = (step + mb + i) % 4;
 *                   for (int j = 0; j < 4; j++) xs[mb][i * 4 + j] = j == ys[mb][i];
 *               }
 *               in[2 * mb] = xs[mb], in[2 * mb + 1] = ys[mb];
 *           }
 *           sp_step_stats stats;
 *           if (sp_trainer_step(t, (const void *const *)in, &stats)) break;
 *           if (sp_exec_rank() == 0) printf("step %d loss %f\n", step, stats.loss);
 *       }
 *       sp_trainer_free(t), sp_program_free(prog), sp_graph_free(g), sp_schedule_free(sch);
 *       return sp_exec_shutdown() != SP_OK;
 *   }
 *
 * Build it with CMake (find_package(starpipe), target_link_libraries(app PRIVATE
 * starpipe::starpipe)) or with `cc app.c $(pkg-config --cflags --libs starpipe)`.
 * examples/ holds fuller programs (their own data, --check against the reference).
 *
 * The modules: status.h (errors), graph.h (the model), program.h (stage programs),
 * backend.h (the table of kernels a program runs on), stages.h and plan.h (schedules,
 * plans, simulator), calibrate.h (a run's measured costs and the prediction of another),
 * search.h (layouts searched on the simulator; device descriptions),
 * optim.h (AdamW), reference.h (the single-process reference), exec.h and train.h (the
 * StarPU runtime and the pipelined trainer), models.h and data.h (the built-in GPT and
 * MLP, and their data), safetensors.h (checkpoints), tokens.h (token shards, the layout
 * of llm.c), tokenizer.h (a tokenizer.json's decoder). */
#ifndef STARPIPE_STARPIPE_H
#define STARPIPE_STARPIPE_H

#include "starpipe/status.h"
#include "starpipe/graph.h"
#include "starpipe/stages.h"
#include "starpipe/program.h"
#include "starpipe/backend.h"
#include "starpipe/device.h"
#include "starpipe/optim.h"
#include "starpipe/reference.h"
#include "starpipe/sample.h"
#include "starpipe/plan.h"
#include "starpipe/calibrate.h"
#include "starpipe/search.h"
#include "starpipe/exec.h"
#include "starpipe/train.h"
#include "starpipe/models.h"
#include "starpipe/data.h"
#include "starpipe/safetensors.h"
#include "starpipe/tokens.h"
#include "starpipe/tokenizer.h"

#endif
