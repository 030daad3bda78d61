/* The learning-rate schedule (optim.h, sp_lr_at) against its closed form: values worked
 * out by hand at the points where the form is simple (warmup steps, the middle and the
 * quarter of the decay, the horizon and after), an independent long-double evaluation at
 * every step of a few schedules, the shape (rising during warmup, falling after, within
 * [lr_min, lr]), the degenerate horizons, and the names. */
#include <math.h>
#include <string.h>

#include "starpipe/optim.h"
#include "tests/check.h"

/* Relative difference within float rounding of a double result. */
static int close_to(float got, double want)
{
    return fabs((double)got - want) <= 1e-6 * fabs(want) + 1e-12;
}

/* The closed form, written again in long double from its description in optim.h. */
static long double form(const sp_lr_schedule *s, int step)
{
    long double lr = s->lr, lo = s->lr_min, W = s->warmup, T = s->total;
    if (s->warmup > 0 && step <= s->warmup) return lr * step / W;
    if (s->decay == SP_LR_DECAY_NONE) return lr;
    long double x = T > W ? (step - W) / (T - W) : 1;
    if (x > 1) x = 1;
    if (x < 0) x = 0;
    long double k = s->decay == SP_LR_DECAY_COSINE ? (1 + cosl(3.14159265358979323846L * x)) / 2
                                                   : 1 - x;
    return lo + (lr - lo) * k;
}

int main(void)
{
    /* by hand: lr 1e-3, floor 1e-4, 10 warmup steps, horizon 110 (100 decay steps) */
    sp_lr_schedule c = { .lr = 1e-3f, .lr_min = 1e-4f, .warmup = 10, .total = 110,
                         .decay = SP_LR_DECAY_COSINE };
    sp_lr_schedule l = c, n = c;
    l.decay = SP_LR_DECAY_LINEAR;
    n.decay = SP_LR_DECAY_NONE;
    const struct { const sp_lr_schedule *s; int step; double want; } pts[] = {
        { &c, 1, 1e-4 },   { &c, 5, 5e-4 },   { &c, 10, 1e-3 },
        { &c, 35, 1e-4 + 9e-4 * 0.85355339059327376 }, /* x = 1/4: (1 + cos(pi/4)) / 2 */
        { &c, 60, 5.5e-4 },                             /* x = 1/2 */
        { &c, 85, 1e-4 + 9e-4 * 0.14644660940672624 }, /* x = 3/4 */
        { &c, 110, 1e-4 }, { &c, 111, 1e-4 }, { &c, 1000000, 1e-4 },
        { &l, 5, 5e-4 },   { &l, 35, 7.75e-4 }, { &l, 60, 5.5e-4 }, { &l, 110, 1e-4 },
        { &l, 500, 1e-4 },
        { &n, 3, 3e-4 },   { &n, 11, 1e-3 },  { &n, 60, 1e-3 },  { &n, 5000, 1e-3 },
    };
    for (size_t i = 0; i < sizeof pts / sizeof *pts; i++) {
        float got = sp_lr_at(pts[i].s, pts[i].step);
        CHECK(close_to(got, pts[i].want), "%s step %d: %.9g, want %.9g",
              sp_lr_decay_name(pts[i].s->decay), pts[i].step, got, pts[i].want);
    }
    /* the peak itself, bit for bit, where the schedule is flat: a constant schedule is the
     * plain --lr, so runs without a schedule keep their bits */
    sp_lr_schedule flat = { .lr = 3e-4f, .decay = SP_LR_DECAY_NONE };
    for (int step = 0; step < 100; step++)
        CHECK(sp_lr_at(&flat, step) == 3e-4f, "constant schedule at step %d: %.9g", step,
              sp_lr_at(&flat, step));
    CHECK(sp_lr_at(&c, 10) == 1e-3f, "end of warmup is not the peak exactly");

    /* every step of a few schedules against the long-double form; the shape */
    const sp_lr_schedule all[] = {
        c, l, n,
        { .lr = 6e-4f, .lr_min = 6e-5f, .warmup = 7, .total = 53, .decay = SP_LR_DECAY_COSINE },
        { .lr = 0.01f, .lr_min = 0, .warmup = 0, .total = 19, .decay = SP_LR_DECAY_LINEAR },
        { .lr = 0.01f, .lr_min = 0.001f, .warmup = 0, .total = 1, .decay = SP_LR_DECAY_COSINE },
        /* a horizon inside the warmup: the floor right after it */
        { .lr = 0.01f, .lr_min = 0.002f, .warmup = 8, .total = 5, .decay = SP_LR_DECAY_COSINE },
    };
    for (size_t k = 0; k < sizeof all / sizeof *all; k++) {
        const sp_lr_schedule *s = &all[k];
        float prev = 0;
        for (int step = 1; step <= s->total + s->warmup + 20; step++) {
            float got = sp_lr_at(s, step);
            long double want = form(s, step);
            CHECK(close_to(got, (double)want), "schedule %zu step %d: %.9g, form %.9Lg", k, step,
                  got, want);
            CHECK(sp_lr_at(s, step) == got, "schedule %zu step %d: not a function of the step",
                  k, step);
            if (step <= s->warmup)
                CHECK(got > prev, "schedule %zu: warmup does not rise at step %d", k, step);
            else if (step > 1)
                CHECK(got <= prev, "schedule %zu: decay rises at step %d", k, step);
            if (step > s->warmup)
                CHECK(got >= s->lr_min && got <= s->lr, "schedule %zu step %d: %.9g outside "
                      "[lr_min, lr]", k, step, got);
            prev = got;
        }
        if (s->decay != SP_LR_DECAY_NONE)
            CHECK(sp_lr_at(s, s->total > s->warmup ? s->total : s->warmup + 1) == s->lr_min,
                  "schedule %zu: not at the floor at the horizon", k);
    }

    /* names */
    for (int d = SP_LR_DECAY_NONE; d <= SP_LR_DECAY_LINEAR; d++)
        CHECK(sp_lr_decay_parse(sp_lr_decay_name((sp_lr_decay)d)) == d, "name %d", d);
    CHECK(sp_lr_decay_parse("Cosine") < 0 && sp_lr_decay_parse("") < 0 &&
          sp_lr_decay_parse(NULL) < 0, "bad names accepted");
    return check_summary("test_lr_schedule");
}
