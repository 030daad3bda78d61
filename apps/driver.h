/* The training driver shared by starpipe-gpt and starpipe-mlp: flags and environment,
 * the reference or the pipelined run, --check against the reference, progress lines,
 * traces. An app supplies its model through sp_app_model and calls sp_app_main. */
#ifndef STARPIPE_APP_DRIVER_H
#define STARPIPE_APP_DRIVER_H

#include <stdint.h>
#include <stdio.h>

#include "apps/checkpoint.h"
#include "starpipe/graph.h"

typedef struct {
    const char *name;        /* program name, for messages */
    const char *defaults;    /* the model-flag part of --help */
    void *cfg;               /* the app's model configuration */
    /* The model's flags (each takes a value), NULL-terminated. */
    const char *const *flags;
    /* Handles one of them (value never NULL): 1 taken, -1 bad value (message printed). */
    int (*flag)(void *cfg, const char *flag, const char *value);
    /* After parsing: checks the configuration, loads data, sets *samples_per_mb (tokens
     * or rows of one microbatch, for the throughput). 0 ok, else a message in msg. */
    int (*prepare)(void *cfg, double *samples_per_mb, char *msg, size_t len);
    /* After prepare, on one rank, before step 1: reads all the data once to check every
     * value (the GPT: each token within the vocabulary), so that a bad one is refused
     * before any task rather than when a batch draws it; *bytes read. 0 ok, else a
     * message. May be NULL. */
    int (*scan_data)(void *cfg, double *bytes, char *msg, size_t len);
    /* The model cut into `stages`, as member tensor_rank of a tensor group of `tensor`
     * ranks (1, 0: the whole model; graph.h, sp_graph_set_tensor). */
    sp_graph *(*build)(void *cfg, int stages, int tensor, int tensor_rank, sp_status *st);
    /* A cut balanced by cost (apps/cut.c): how many blocks the driver may cut (0: none,
     * e.g. the user gave --stage-layers), and the cut build() then uses for that many
     * stages (stage_layers NULL: the even cut again). Each stage but the first and the
     * last needs a block; those two may hold none (the embedding, the head alone). May be
     * NULL: the model is cut evenly. */
    int (*cut_layers)(void *cfg);
    void (*set_cut)(void *cfg, const int *stage_layers, int stages);
    /* Fills the graph inputs (in sp_program_input order) of microbatch mb of step. */
    void (*batch)(void *cfg, uint64_t seed, int step, int mb, void *const *inputs);
    /* "220544 parameters, ..." line after the banner; may be NULL. */
    void (*describe)(void *cfg, FILE *f);
    const char *sample_unit;       /* "tok", "rows" */
    /* Everything that changes the computation, e.g. "gpt vocab=256 context=64 layers=4
     * ..."; stored in checkpoints, and a checkpoint of another signature is refused. */
    void (*signature)(void *cfg, char *buf, size_t len);
    /* The model's flags a resume needs to continue the same run, "--flag value" lines
     * ("--layers 4\n--batch 8\n"), stored in checkpoints; may be NULL. */
    void (*settings)(void *cfg, char *buf, size_t len);
    /* The flags settings() may store, NULL-terminated: a resume restores these and the
     * driver's own (--seed, --lr, ...), and refuses a checkpoint that stores any other
     * (a file from elsewhere must not choose where the run writes). */
    const char *const *settings_flags;
    /* The flag that says which model the app builds ("--arch"; NULL: one model), and its
     * value in checkpoints that do not store it (written before it was stored). A resume
     * restores it like any setting; given with another value, the checkpoint is refused. */
    const char *kind_flag, *kind_unstored;
    /* Flags to lower when the parameters, or the activations, do not fit, for messages
     * ("--channels or --layers"); may be NULL. */
    const char *param_flags, *act_flags;
    /* Evaluation (--eval-every). hold_out, after prepare: set aside the data evaluation
     * reads, so that batch() never reads it (the GPT: the tail of its file); 0 ok, else
     * a message; NULL when the held-out data is drawn elsewhere (the MLP: another stream
     * of its generator). eval_batch fills held-out microbatch k of K (inputs as batch());
     * NULL: the model has no held-out data and --eval-every is refused. */
    int (*hold_out)(void *cfg, char *msg, size_t len);
    void (*eval_batch)(void *cfg, uint64_t seed, int k, int K, void *const *inputs);
    /* Sampling (--sample): the model for one sequence in one stage, with the trained
     * model's parameter names, an i32 input "tokens" (1,T) and a tensor named "logits"
     * (1,T,V) (sp_generate); ntokens the --tokenizer's size (0: none, the sample is
     * printed as bytes): NULL with a message where the two do not fit. Also called before
     * step 1 (app_check_sample), so a run that could not sample never starts. NULL: the
     * model does not generate text. */
    sp_graph *(*build_sampler)(void *cfg, int ntokens, sp_status *st);
    /* The tokens of the model's vocabulary (its logits may be padded past them: the sample
     * draws among the tokens); NULL: every column. */
    int (*vocab)(void *cfg);
    /* How checkpoints store the parameters (apps/checkpoint.h; NULL: under their graph
     * names), called with cfg. */
    int (*ckpt_layout)(const void *cfg, const sp_graph *g, sp_tensor p, ckpt_piece *pieces);
} sp_app_model;

/* Parses argv, runs, returns the process exit code. */
int sp_app_main(int argc, char **argv, sp_app_model *model);

#endif
