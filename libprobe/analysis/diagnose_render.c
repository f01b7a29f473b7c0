/*
 * libprobe/analysis/diagnose_render.c - renders a probe_diag: a text report for people
 * (sections: trace, first non-finite event, loss scaler, clipping, gradient
 * underflow, silent faults, diagnosis) into a buffer, and the same content
 * as the JSON document (the one writer of `ampprobe postmortem --json`).
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis-impl.h"
#include "diagnose-impl.h"

static void fmt_num(char *b, size_t n, double x) { probe_num_format(b, n, x, 6); }

static double frac(uint64_t a, uint64_t b) {
  return b ? (double)a / (double)b : NAN;
}

/* "12.34%", or "n/a" when there is no data (NaN). */
static void fmt_pct(char *b, size_t n, double x) {
  if (isnan(x))
    snprintf(b, n, "n/a");
  else
    snprintf(b, n, "%.2f%%", 100 * x);
}

/* ---- text ----------------------------------------------------------------- */


/* The clip order and its basis; an unknown order's basis says "cannot
 * tell" itself (it printed "cannot tell: cannot tell: ..."). */
static void clip_order_line(FILE *f, const probe_diag *d) {
  if (d->clip_order < 0)
    fprintf(f, "  clip order  %s\n", d->clip_order_basis);
  else
    fprintf(f, "  clip order  %s: %s\n",
            d->clip_order == 1 ? "BEFORE unscaling" : "after unscaling",
            d->clip_order_basis);
}

static void render_text(const probe_diag *d, FILE *f) {
  char a[32], b[32];
  fprintf(f, "trace       %s\n", d->path);
  fprintf(f, "status      %s; %s; %lld steps (%lld..%lld), ",
          d->complete     ? "complete"
          : d->aborted[0] ? "ABORTED (the job ended abnormally; the tracer "
                            "closed the trace)"
                          : "INCOMPLETE (writer did not close it)",
          d->record_mode == PROBE_MODE_FULL ? "full per-layer trace"
                                            : "flight recorder",
          (long long)d->n_steps, (long long)d->first_step,
          (long long)d->last_step);
  if (d->n_records > 0)
    fprintf(f, "%lld layer records (steps %lld..%lld)\n",
            (long long)d->n_records, (long long)d->rec_first_step,
            (long long)d->rec_last_step);
  else
    fprintf(f, "no per-layer records%s\n",
            d->record_mode == PROBE_MODE_FULL
                ? ""
                : " (the flight recorder writes them at a non-finite value)");
  if (!d->complete)
    fprintf(f, "            last step recorded: %lld\n",
            (long long)d->last_step);
  if (d->aborted[0] && d->aborted_step >= 0)
    fprintf(f, "            ended by %s in step %lld (closed half done)\n",
            d->aborted, (long long)d->aborted_step);
  else if (d->aborted[0])
    fprintf(f, "            ended by %s\n", d->aborted);
  if (d->joined)
    fprintf(f, "            the rank ran out of inputs and joined the other "
               "ranks after its last step (uneven inputs: DDP's join())\n");
  if (d->precision_policy[0])
    fprintf(f, "precision   %s\n", d->precision_policy);
  fmt_num(a, sizeof a, d->first_loss);
  fmt_num(b, sizeof b, d->last_loss);
  if (!d->first_loss_seen && d->n_steps > 0) /* it read "nan -> nan" */
    fprintf(f, "loss        not measured (no step recorded it)");
  else
    fprintf(f, "loss        %s -> %s", a, b);
  if (d->first_nonfinite_loss_step >= 0)
    fprintf(f, "; first non-finite loss at step %lld (%lld non-finite)",
            (long long)d->first_nonfinite_loss_step,
            (long long)d->nonfinite_loss_steps);
  fprintf(f, "\n");
  fprintf(f, "verdict     %s\n\n", probe_verdict_name(d->verdict));

  fprintf(f, "FIRST NON-FINITE EVENT\n");
  if (d->event == PROBE_DIAG_EVENT_NONE) {
    fprintf(f, "  none in the forward pass, the weights or the loss\n");
    if (d->unskipped_grad_overflow_step >= 0)
      fprintf(f, "  (gradients held inf/NaN first at step %lld; at step %lld "
                 "the scaler did not skip it: it was masked before the "
                 "parameter gradients, as a ReLU's backward zeroes those "
                 "positions)\n",
              (long long)d->first_grad_overflow_step,
              (long long)d->unskipped_grad_overflow_step);
    else if (d->first_grad_overflow_step >= 0 && d->skipped_steps > 0)
      fprintf(f, "  (scaled gradients overflowed first at step %lld; the "
                 "scaler skipped those steps, as designed)\n",
              (long long)d->first_grad_overflow_step);
    else if (d->first_grad_overflow_step >= 0)
      fprintf(f, "  (gradients held inf/NaN first at step %lld; the trace "
                 "does not say that the scaler skipped it)\n",
              (long long)d->first_grad_overflow_step);
  } else {
    fprintf(f, "  step        %lld\n", (long long)d->event_step);
    fprintf(f, "  phase       %s\n", probe_phase_name(d->event_phase));
    if (d->event == PROBE_DIAG_EVENT_OVERFLOW && d->origin_layer >= 0 &&
        d->layers[d->origin_layer].info.precision == PROBE_DTYPE_F32)
      fprintf(f, "  kind        %s: finite values overflowed to inf (the "
                 "layer runs in FP32: past 3.4e38)\n",
              probe_diag_event_name(d->event));
    else
      fprintf(f, "  kind        %s: %s\n", probe_diag_event_name(d->event),
              probe__diag_event_text(d));
    if (d->origin_layer >= 0) {
      fprintf(f, "  origin      %s (%s, %s) at %s: %llu NaN, %llu +inf, %llu "
                 "-inf of %llu\n",
              probe_diag_layer_name(d, d->origin_layer),
              probe_kind_name(d->layers[d->origin_layer].info.kind),
              probe_dtype_name(d->layers[d->origin_layer].info.precision),
              probe_site_name(d->origin_site),
              (unsigned long long)d->origin_out.nan_count,
              (unsigned long long)d->origin_out.posinf_count,
              (unsigned long long)d->origin_out.neginf_count,
              (unsigned long long)d->origin_out.count);
      if (d->origin_calls > 1)
        fprintf(f, "  call        %d of %d of %s in this step's %s%s\n",
                (int)d->origin_call, (int)d->origin_calls,
                probe_diag_layer_name(d, d->origin_layer),
                probe_phase_name(d->event_phase),
                d->event_phase == PROBE_PHASE_BACKWARD
                    ? " (the backward runs the calls last first)"
                    : "");
      if (d->have_origin_in) {
        const probe_stats *in = &d->origin_in;
        fmt_num(a, sizeof a, in->absmax);
        /* a call with several inputs: which one (argument order) */
        char which[48] = "";
        if (d->origin_in_count > 1)
          snprintf(which, sizeof which, "%d of %d: ", (int)d->origin_in_index,
                   (int)d->origin_in_count);
        if (probe_stats_nonfinite(in))
          fprintf(f, "  its input   %s%llu NaN, %llu inf; finite absmax %s, of "
                     "%llu\n",
                  which, (unsigned long long)in->nan_count,
                  (unsigned long long)(in->posinf_count + in->neginf_count), a,
                  (unsigned long long)in->count);
        else if (probe__diag_range_prec(d, d->origin_layer) == PROBE_DTYPE_BF16)
          /* BF16 flushes only below ~1e-38: FP16's count says nothing */
          fprintf(f, "  its input   finite: absmax %s, %llu zeros, of %llu\n",
                  a, (unsigned long long)in->zero_count,
                  (unsigned long long)in->count);
        else
          fprintf(f, "  its input   %sfinite: absmax %s, %llu zeros, %llu "
                     "would flush in FP16, of %llu\n",
                  which, a, (unsigned long long)in->zero_count,
                  (unsigned long long)in->f16_flush,
                  (unsigned long long)in->count);
      }
      if (d->event_evidence[0])
        fprintf(f, "  evidence    %s\n", d->event_evidence);
      if (d->feeder_layer >= 0 && d->feeder_calls > 1)
        fprintf(f, "  fed by      %s (%s), %s call %d of %d in this step's %s\n",
                probe_diag_layer_name(d, d->feeder_layer),
                probe_kind_name(d->layers[d->feeder_layer].info.kind),
                d->feeder_layer == d->origin_layer ? "its own" : "its",
                (int)d->feeder_call, (int)d->feeder_calls,
                /* an optimizer-phase origin's feeder is a forward output */
                probe_phase_name(d->event_phase == PROBE_PHASE_BACKWARD
                                     ? PROBE_PHASE_BACKWARD
                                     : PROBE_PHASE_FORWARD));
      else if (d->feeder_layer >= 0)
        fprintf(f, "  fed by      %s (%s)\n",
                probe_diag_layer_name(d, d->feeder_layer),
                probe_kind_name(d->layers[d->feeder_layer].info.kind));
    } else if (d->event_evidence[0]) { /* no origin layer: why there is none */
      fprintf(f, "  evidence    %s\n", d->event_evidence);
    }
    if (d->n_passed) {
      fprintf(f, "  passed on   ");
      for (int i = 0; i < d->n_passed; i++)
        fprintf(f, "%s%s", i ? ", " : "", probe_diag_layer_name(d, d->passed[i]));
      if (d->more_passed) fprintf(f, " and %d more", d->more_passed);
      fprintf(f, "\n");
    }
    if (d->nan_from_inf_layer >= 0)
      fprintf(f, "  NaN made    in %s from inf (inf-inf or 0*inf)\n",
              probe_diag_layer_name(d, d->nan_from_inf_layer));
    if (d->n_history == 1 && d->history[0].step == d->event_step) {
      fprintf(f, "  history     none: the event is in the first step recorded"
                 "\n");
    } else if (d->n_history > 0) {
      fprintf(f, "  history of %s (absmax, headroom log2(%s/absmax)):\n",
              probe_diag_layer_name(d, d->origin_layer),
              probe__diag_range_prec(d, d->origin_layer) == PROBE_DTYPE_BF16
                  ? "3.39e38 (BF16)"
                  : "65504");
      for (int i = 0; i < d->n_history; i++) {
        fmt_num(a, sizeof a, d->history[i].absmax);
        fmt_num(b, sizeof b, d->history[i].headroom);
        fprintf(f, "    step %-8lld absmax %-12s headroom %s\n",
                (long long)d->history[i].step, a, b);
      }
    }
  }
  fprintf(f, "\n");

  fprintf(f, "SILENT FAULTS (after warm-up, step %lld on)\n",
          (long long)d->warmup_end);
  int n_silent = 0;
  for (int64_t i = 0; i < d->n_layers; i++) {
    const probe_diag_layer *l = &d->layers[i];
    const probe_diag_collapse *c = &l->collapse;
    if (c->steps > 0) {
      fprintf(f, "  %-24s collapsed in %lld steps from step %lld:", l->display,
              (long long)c->steps, (long long)c->first_step);
      if (c->saved_inf) fprintf(f, " saved statistic inf/NaN;");
      if (c->saved_zero)
        fprintf(f, " saved statistic exactly 0 in %llu of %llu;",
                (unsigned long long)c->saved_zero,
                (unsigned long long)c->saved_count);
      fmt_num(a, sizeof a, c->out_var);
      fmt_num(b, sizeof b, c->in_var);
      fprintf(f, " output variance %s (input %s)\n", a, b);
      n_silent++;
    }
    if (l->fwd_nonfinite_steps > 0) {
      fprintf(f, "  %-24s inf/NaN in the forward pass in %lld steps from step "
                 "%lld\n",
              l->display, (long long)l->fwd_nonfinite_steps,
              (long long)l->fwd_nonfinite_first);
      n_silent++;
    }
  }
  if (!n_silent) fprintf(f, "  none\n");
  fprintf(f, "\n");

  fprintf(f, "LOSS SCALER\n");
  if (!d->scaling_on) {
    fprintf(f, d->scaling_from_config
                   ? "  loss scaling off (the run's config)\n"
                   : "  loss scaling off (scale 1 at every step)\n");
  } else {
    fprintf(f, "  scale       %g -> %g (range %g..%g)%s\n", d->scale_first,
            d->scale_last, d->scale_min, d->scale_max,
            d->scale_collapsed ? "  COLLAPSED" : "");
    fprintf(f, "  events      %lld backoffs (%lld after warm-up), %lld growths,"
               " %lld hysteresis, %lld min-scale clamps\n",
            (long long)d->backoffs, (long long)d->late_backoffs,
            (long long)d->growths, (long long)d->hysteresis_events,
            (long long)d->min_clamps);
    fprintf(f, "  skipped     %lld steps; longest run %lld from step %lld\n",
            (long long)d->skipped_steps, (long long)d->longest_skip_run,
            (long long)d->longest_skip_start);
    int64_t shown_b = 0, shown_c = 0;
    for (int i = 0; i < d->n_backoff_detail; i++) {
      const probe_diag_backoff *bk = &d->backoff_detail[i];
      if (bk->min_clamp) shown_c++;
      else shown_b++;
      fprintf(f, "  %-11s step %lld: %g -> %g",
              bk->min_clamp ? "min clamp" : "backoff", (long long)bk->step,
              bk->old_scale, bk->new_scale);
      if (bk->n_layers) {
        fprintf(f, "; non-finite gradients in ");
        for (int k = 0; k < bk->n_layers; k++)
          fprintf(f, "%s%s", k ? ", " : "", probe_diag_layer_name(d, bk->layers[k]));
        if (bk->more_layers) fprintf(f, " +%d", bk->more_layers);
      }
      fprintf(f, "\n");
    }
    int64_t more_b = d->backoffs - shown_b, more_c = d->min_clamps - shown_c;
    if (more_b > 0 && more_c > 0)
      fprintf(f, "  ...         %lld more backoffs, %lld more min-scale clamps\n",
              (long long)more_b, (long long)more_c);
    else if (more_b > 0)
      fprintf(f, "  ...         %lld more backoff%s\n", (long long)more_b,
              more_b == 1 ? "" : "s");
    else if (more_c > 0)
      fprintf(f, "  ...         %lld more min-scale clamp%s\n",
              (long long)more_c, more_c == 1 ? "" : "s");
  }
  fprintf(f, "\n");

  fprintf(f, "CLIPPING\n");
  if (!d->clipping_on) {
    fprintf(f, "  off\n");
  } else if (d->clip_steps_seen == 0) {
    fprintf(f, "  threshold   %g; no finite gradient norm in the trace\n",
            d->clip_threshold);
    clip_order_line(f, d);
  } else {
    fprintf(f, "  threshold   %g; %lld of %lld steps clipped; largest ratio "
               "norm/threshold %.4g at step %lld\n",
            d->clip_threshold, (long long)d->clipped_steps,
            (long long)d->clip_steps_seen, d->max_clip_ratio,
            (long long)d->max_clip_ratio_step);
    fprintf(f, "  ratio over time (mean/max per window):");
    for (int i = 0; i < PROBE_DIAG_TIME_BUCKETS; i++)
      if (d->bucket_n[i])
        fprintf(f, " [%lld] %.3g/%.3g", (long long)d->bucket_first_step[i],
                d->bucket_ratio_mean[i], d->bucket_ratio_max[i]);
    fprintf(f, "\n");
    fmt_num(a, sizeof a, d->corr_norm_scale);
    fmt_num(b, sizeof b, d->norm_over_scale);
    fprintf(f, "  corr(log norm, log scale) %s; norm/scale %s%s\n", a, b,
            d->clip_scaled_signature
                ? "  -> clipping sees SCALED gradients"
                : "");
    clip_order_line(f, d);
    if (d->clip_norm_steps > 0)
      fprintf(f, "  norm seen   = recorded (scaled) weight-gradient norm on %lld "
                 "of %lld comparable steps; = that norm / scale on the rest\n",
              (long long)d->clip_norm_scaled_steps, (long long)d->clip_norm_steps);
  }
  fprintf(f, "\n");

  fprintf(f, "GRADIENT UNDERFLOW (FP16 layers: values subnormal or flushing "
             "in FP16, first -> second half; zeros)\n");
  int shown_l = 0;
  for (int64_t i = 0; i < d->n_layers; i++) {
    const probe_diag_layer *l = &d->layers[i];
    uint64_t c0 = l->grad_count[0], c1 = l->grad_count[1];
    if (!c0 && !c1) continue;
    char u0[16], u1[16], z[16];
    fmt_pct(u0, sizeof u0, frac(l->grad_subnormal[0], c0));
    fmt_pct(u1, sizeof u1, frac(l->grad_subnormal[1], c1));
    fmt_pct(z, sizeof z, frac(l->grad_zero[0] + l->grad_zero[1], c0 + c1));
    fprintf(f, "  %-24s %7s -> %7s   zeros %7s\n", l->display, u0, u1, z);
    shown_l++;
  }
  if (!shown_l && probe__diag_range_prec(d, -1) == PROBE_DTYPE_BF16)
    fprintf(f, "  no FP16 layers: BF16 has FP32's range and flushes only "
               "below ~1e-38, so gradients do not underflow there\n");
  else if (!shown_l)
    fprintf(f, "  no gradient records of FP16 layers\n");
  fprintf(f, "\n");

  fprintf(f, "DIAGNOSIS (most likely first)\n");
  for (int i = 0; i < d->n_findings; i++) {
    const probe_diag_finding *fd = &d->findings[i];
    fprintf(f, "  %d. [%s] %s\n", i + 1, probe_diag_finding_name(fd->id), fd->title);
    for (int k = 0; k < fd->n_evidence; k++)
      fprintf(f, "     - %s\n", fd->evidence[k]);
    fprintf(f, "     next: %s\n", fd->next_step);
  }
}

probe_status probe_diag_render_text(const probe_diag *d, char **text_out) {
  if (!d || !text_out) return PROBE_ERR_INVALID_ARG;
  *text_out = NULL;
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return PROBE_ERR_NOMEM;
  render_text(d, f);
  if (fclose(f) != 0 || !buf) {
    free(buf);
    return PROBE_ERR_NOMEM;
  }
  *text_out = buf;
  return PROBE_OK;
}

/* ---- JSON (docs/cli.md, "postmortem --json") -------------------------------- */

static void stats_json(probe__jw *w, const char *key, const probe_stats *s) {
  probe__jw_obj(w, key);
  probe__jw_int(w, "count", (int64_t)s->count);
  probe__jw_int(w, "nan", (int64_t)s->nan_count);
  probe__jw_int(w, "posinf", (int64_t)s->posinf_count);
  probe__jw_int(w, "neginf", (int64_t)s->neginf_count);
  probe__jw_int(w, "zeros", (int64_t)s->zero_count);
  probe__jw_int(w, "f16_flush", (int64_t)s->f16_flush);
  probe__jw_opt(w, "absmax", s->absmax); /* null: no finite value */
  probe__jw_end(w, '}');
}

static void layer_ref(probe__jw *w, const char *key, const probe_diag *d,
                      int32_t id) {
  if (id < 0)
    probe__jw_null(w, key);
  else
    probe__jw_str(w, key, probe_diag_layer_name(d, id));
}

/* A measured number: finite, or null (NaN: not measured; inf and NaN
 * cannot be read by a program as a number). */
static void fin_num(probe__jw *w, const char *key, double v) {
  if (isfinite(v))
    probe__jw_num(w, key, v);
  else
    probe__jw_null(w, key);
}

/* A call number (origin_call and the like: 1-based; 0, none, is null). */
static void call_ref(probe__jw *w, const char *key, int32_t v) {
  if (v > 0)
    probe__jw_int(w, key, v);
  else
    probe__jw_null(w, key);
}

/* The whole document; the caller wraps it (one trace) or lists it (several). */
void probe__diag_json(probe__jw *w, const char *key, const probe_diag *d) {
  probe__jw_obj(w, key);
  probe__jw_str(w, "verdict", probe_verdict_name(d->verdict));
  probe__jw_obj(w, "trace");
  probe__jw_str(w, "path", d->path);
  probe__jw_bool(w, "complete", d->complete);
  probe__jw_bool(w, "joined", d->joined);
  /* the abort mark: null when none */
  if (d->aborted[0]) probe__jw_str(w, "aborted", d->aborted);
  else probe__jw_null(w, "aborted");
  probe__jw_step(w, "aborted_step", d->aborted_step);
  probe__jw_str(w, "record_mode", d->record_mode == PROBE_MODE_FULL
                                      ? "full"
                                      : "flight-recorder");
  probe__jw_int(w, "steps", d->n_steps);
  probe__jw_int(w, "first_step", d->first_step);
  probe__jw_int(w, "last_step", d->last_step);
  probe__jw_int(w, "records", d->n_records);
  probe__jw_int(w, "layers", d->n_layers);
  probe__jw_str(w, "precision_policy", d->precision_policy);
  probe__jw_str(w, "config_name", d->cfg_name);
  probe__jw_end(w, '}');

  probe__jw_obj(w, "loss");
  probe__jw_num(w, "first", d->first_loss);
  probe__jw_num(w, "last", d->last_loss);
  probe__jw_opt(w, "min", d->min_loss); /* null: no finite loss */
  probe__jw_step(w, "first_nonfinite_step", d->first_nonfinite_loss_step);
  probe__jw_int(w, "nonfinite_steps", d->nonfinite_loss_steps);
  probe__jw_end(w, '}');

  /* loss-diverging's numbers (docs/precision.md, "A finite loss that
   * diverges"); judged false (loss_window 0): too few finite losses or a
   * loss below 0, and every other key is null. NaN and inf are null. */
  probe__jw_obj(w, "loss_trend");
  probe__jw_bool(w, "judged", d->loss_window > 0);
  if (d->loss_window > 0)
    probe__jw_int(w, "window", d->loss_window);
  else
    probe__jw_null(w, "window");
  probe__jw_obj(w, "best");
  probe__jw_step(w, "step", d->loss_best_step);
  fin_num(w, "median", d->loss_best_median);
  fin_num(w, "lr", d->loss_best_lr);
  probe__jw_end(w, '}');
  probe__jw_obj(w, "last");
  fin_num(w, "median", d->loss_last_median);
  fin_num(w, "lr", d->loss_last_lr);
  probe__jw_end(w, '}');
  fin_num(w, "growth", d->loss_growth);
  probe__jw_step(w, "rise_step", d->loss_rise_step);
  probe__jw_bool(w, "diverged", d->loss_diverged);
  if (d->diverge_layer >= 0) {
    probe__jw_obj(w, "first_grown_layer");
    probe__jw_str(w, "name", probe_diag_layer_name(d, d->diverge_layer));
    probe__jw_step(w, "step", d->diverge_layer_step);
    fin_num(w, "growth", d->diverge_layer_growth);
    probe__jw_str(w, "site", d->diverge_layer_bwd ? "gradient" : "activation");
    probe__jw_end(w, '}');
  } else {
    probe__jw_null(w, "first_grown_layer");
  }
  probe__jw_end(w, '}');

  probe__jw_obj(w, "event");
  probe__jw_str(w, "kind", probe_diag_event_name(d->event));
  probe__jw_str(w, "description", probe__diag_event_text(d));
  if (d->event != PROBE_DIAG_EVENT_NONE) {
    probe__jw_int(w, "step", d->event_step);
    probe__jw_str(w, "phase", probe_phase_name(d->event_phase));
    layer_ref(w, "origin_layer", d, d->origin_layer);
    if (d->origin_layer >= 0) {
      probe__jw_str(w, "origin_kind",
                    probe_kind_name(
                        (probe_kind)d->layers[d->origin_layer].info.kind));
      probe__jw_str(w, "origin_site", probe_site_name(d->origin_site));
      call_ref(w, "origin_call", d->origin_call);
      call_ref(w, "origin_calls", d->origin_calls);
      stats_json(w, "origin_output", &d->origin_out);
      if (d->have_origin_in) stats_json(w, "origin_input", &d->origin_in);
      /* which input of the call origin_input is (argument order), of how
       * many: null when not known */
      call_ref(w, "origin_input_index", d->origin_in_index);
      call_ref(w, "origin_inputs", d->origin_in_count);
    }
    probe__jw_str(w, "evidence", d->event_evidence);
    layer_ref(w, "fed_by", d, d->feeder_layer);
    call_ref(w, "fed_by_call", d->feeder_call);
    call_ref(w, "fed_by_calls", d->feeder_calls);
    probe__jw_bool(w, "fed_by_own_call",
                   d->feeder_layer >= 0 && d->feeder_layer == d->origin_layer);
    probe__jw_arr(w, "passed_on");
    for (int i = 0; i < d->n_passed; i++)
      probe__jw_str(w, NULL, probe_diag_layer_name(d, d->passed[i]));
    probe__jw_end(w, ']');
    layer_ref(w, "nan_from_inf_layer", d, d->nan_from_inf_layer);
    probe__jw_arr(w, "history");
    for (int i = 0; i < d->n_history; i++) {
      probe__jw_obj(w, NULL);
      probe__jw_int(w, "step", d->history[i].step);
      probe__jw_opt(w, "absmax", d->history[i].absmax);
      probe__jw_opt(w, "headroom", d->history[i].headroom);
      probe__jw_end(w, '}');
    }
    probe__jw_end(w, ']');
  }
  probe__jw_step(w, "first_gradient_overflow_step", d->first_grad_overflow_step);
  probe__jw_end(w, '}');

  probe__jw_obj(w, "silent_faults");
  probe__jw_int(w, "warmup_end_step", d->warmup_end);
  layer_ref(w, "first_layer", d, d->silent_layer);
  probe__jw_arr(w, "layers");
  for (int64_t i = 0; i < d->n_layers; i++) {
    const probe_diag_layer *l = &d->layers[i];
    const probe_diag_collapse *c = &l->collapse;
    if (c->steps == 0 && l->fwd_nonfinite_steps == 0) continue;
    probe__jw_obj(w, NULL);
    probe__jw_str(w, "layer", l->display);
    probe__jw_str(w, "kind", probe_kind_name((probe_kind)l->info.kind));
    probe__jw_int(w, "collapse_steps", c->steps);
    probe__jw_step(w, "collapse_first_step", c->first_step);
    if (c->steps > 0) {
      probe__jw_bool(w, "saved_nonfinite", c->saved_inf);
      probe__jw_int(w, "saved_zeros", (int64_t)c->saved_zero);
      probe__jw_int(w, "saved_count", (int64_t)c->saved_count);
      probe__jw_opt(w, "output_variance", c->out_var);
      probe__jw_opt(w, "input_variance", c->in_var);
    }
    probe__jw_int(w, "forward_nonfinite_steps", l->fwd_nonfinite_steps);
    probe__jw_step(w, "forward_nonfinite_first_step", l->fwd_nonfinite_first);
    probe__jw_end(w, '}');
  }
  probe__jw_end(w, ']');
  probe__jw_end(w, '}');

  probe__jw_obj(w, "scaler");
  probe__jw_bool(w, "enabled", d->scaling_on);
  probe__jw_str(w, "enabled_source",
                d->scaling_from_config ? "config" : "loss-scale");
  probe__jw_opt(w, "scale_first", d->scale_first);
  probe__jw_opt(w, "scale_last", d->scale_last);
  probe__jw_opt(w, "scale_min", d->scale_min);
  probe__jw_opt(w, "scale_max", d->scale_max);
  probe__jw_int(w, "backoffs", d->backoffs);
  probe__jw_int(w, "late_backoffs", d->late_backoffs);
  probe__jw_int(w, "growths", d->growths);
  probe__jw_int(w, "hysteresis", d->hysteresis_events);
  probe__jw_int(w, "min_clamps", d->min_clamps);
  probe__jw_int(w, "skipped_steps", d->skipped_steps);
  probe__jw_int(w, "longest_skip_run", d->longest_skip_run);
  probe__jw_int(w, "longest_skip_start", d->longest_skip_start);
  probe__jw_bool(w, "collapsed", d->scale_collapsed);
  probe__jw_arr(w, "backoff_detail");
  for (int i = 0; i < d->n_backoff_detail; i++) {
    const probe_diag_backoff *bk = &d->backoff_detail[i];
    probe__jw_obj(w, NULL);
    probe__jw_int(w, "step", bk->step);
    probe__jw_str(w, "kind", bk->min_clamp ? "min_clamp" : "backoff");
    probe__jw_num(w, "old_scale", bk->old_scale);
    probe__jw_num(w, "new_scale", bk->new_scale);
    probe__jw_arr(w, "nonfinite_grad_layers");
    for (int k = 0; k < bk->n_layers; k++)
      probe__jw_str(w, NULL, probe_diag_layer_name(d, bk->layers[k]));
    probe__jw_end(w, ']');
    probe__jw_end(w, '}');
  }
  probe__jw_end(w, ']');
  probe__jw_end(w, '}');

  /* skip-streak's numbers (docs/precision.md, "A streak of skipped
   * steps"): null when no streak of PROBE_DIAG_SKIP_STREAK skipped steps
   * ended before the trace did. */
  if (d->skip_streak_start >= 0) {
    probe__jw_obj(w, "skip_streak");
    probe__jw_step(w, "start", d->skip_streak_start);
    probe__jw_step(w, "end", d->skip_streak_end);
    probe__jw_int(w, "length", d->skip_streak_len);
    probe__jw_int(w, "streaks", d->skip_streaks);
    fin_num(w, "scale_from", d->skip_streak_scale_from);
    fin_num(w, "scale_to", d->skip_streak_scale_to);
    layer_ref(w, "layer", d, d->skip_streak_layer);
    probe__jw_int(w, "layer_steps",
                  d->skip_streak_layer >= 0 ? d->skip_streak_layer_steps : 0);
    probe__jw_int(w, "loss_nonfinite", d->skip_streak_loss_nf);
    probe__jw_end(w, '}');
  } else {
    probe__jw_null(w, "skip_streak");
  }

  /* weights-stagnant's numbers (docs/precision.md, "Weights that stop
   * changing"): null when no step could judge a parameter (no
   * master_weight records of consecutive steps with an lr > 0 and a
   * finite, nonzero gradient). */
  if (d->stag_judged) {
    probe__jw_obj(w, "weights_stagnant");
    probe__jw_bool(w, "stagnant", probe__diag_stag_fires(d));
    probe__jw_int(w, "layers", d->stag_layers);
    probe__jw_int(w, "params", d->stag_params);
    probe__jw_int(w, "elements", d->stag_elems);
    probe__jw_int(w, "total_elements", d->stag_total_elems);
    fin_num(w, "share", d->stag_total_elems > 0
                            ? (double)d->stag_elems / (double)d->stag_total_elems
                            : NAN);
    probe__jw_step(w, "first_step", d->stag_first_step);
    probe__jw_int(w, "longest", d->stag_longest);
    layer_ref(w, "layer", d, d->stag_layer);
    if (d->stag_layer >= 0)
      probe__jw_str(w, "stored_as", d->stag_dtype == PROBE_DTYPE_BF16  ? "bf16"
                                    : d->stag_dtype == PROBE_DTYPE_F16 ? "fp16"
                                                                       : "fp32");
    else
      probe__jw_null(w, "stored_as");
    fin_num(w, "lr", d->stag_lr);
    fin_num(w, "grad_rms", d->stag_grad_rms);
    fin_num(w, "weight_rms", d->stag_weight_rms);
    fin_num(w, "half_spacing", d->stag_half_ulp);
    fin_num(w, "update_ratio", d->stag_ratio);
    probe__jw_end(w, '}');
  } else {
    probe__jw_null(w, "weights_stagnant");
  }

  probe__jw_obj(w, "clipping");
  probe__jw_bool(w, "enabled", d->clipping_on);
  if (d->clipping_on) {
    probe__jw_num(w, "threshold", d->clip_threshold);
    probe__jw_int(w, "clipped_steps", d->clipped_steps);
    probe__jw_int(w, "steps", d->clip_steps_seen);
    probe__jw_num(w, "max_ratio", d->max_clip_ratio);
    probe__jw_int(w, "max_ratio_step", d->max_clip_ratio_step);
    probe__jw_arr(w, "ratio_over_time");
    for (int i = 0; i < PROBE_DIAG_TIME_BUCKETS; i++) {
      if (!d->bucket_n[i]) continue;
      probe__jw_obj(w, NULL);
      probe__jw_int(w, "first_step", d->bucket_first_step[i]);
      probe__jw_int(w, "steps", d->bucket_n[i]);
      probe__jw_num(w, "mean_ratio", d->bucket_ratio_mean[i]);
      probe__jw_num(w, "max_ratio", d->bucket_ratio_max[i]);
      probe__jw_end(w, '}');
    }
    probe__jw_end(w, ']');
  }
  probe__jw_opt(w, "corr_log_norm_log_scale", d->corr_norm_scale);
  probe__jw_opt(w, "norm_over_scale", d->norm_over_scale);
  probe__jw_int(w, "norm_compared_steps", d->clip_norm_steps);
  probe__jw_int(w, "norm_scaled_steps", d->clip_norm_scaled_steps);
  probe__jw_str(w, "clip_order", d->clip_order == 1   ? "before-unscale"
                                  : d->clip_order == 0 ? "after-unscale"
                                                       : "cannot-tell");
  probe__jw_str(w, "clip_order_basis", d->clip_order_basis);
  probe__jw_bool(w, "clips_scaled_gradients", d->clip_scaled_signature);
  probe__jw_end(w, '}');

  probe__jw_arr(w, "layers");
  for (int64_t i = 0; i < d->n_layers; i++) {
    const probe_diag_layer *l = &d->layers[i];
    uint64_t c0 = l->grad_count[0], c1 = l->grad_count[1];
    if (!c0 && !c1) continue;
    probe__jw_obj(w, NULL);
    probe__jw_str(w, "layer", l->display);
    probe__jw_str(w, "kind", probe_kind_name((probe_kind)l->info.kind));
    probe__jw_opt(w, "subnormal_or_flush_first_half",
                  frac(l->grad_subnormal[0], c0));
    probe__jw_opt(w, "subnormal_or_flush_second_half",
                  frac(l->grad_subnormal[1], c1));
    probe__jw_opt(w, "zero_fraction",
                  frac(l->grad_zero[0] + l->grad_zero[1], c0 + c1));
    probe__jw_num(w, "min_forward_headroom", l->min_fwd_headroom);
    probe__jw_int(w, "origin_steps", l->origin_steps);
    probe__jw_int(w, "backoff_steps", l->backoff_steps);
    probe__jw_end(w, '}');
  }
  probe__jw_end(w, ']');

  probe__jw_arr(w, "diagnosis");
  for (int i = 0; i < d->n_findings; i++) {
    const probe_diag_finding *fd = &d->findings[i];
    probe__jw_obj(w, NULL);
    probe__jw_int(w, "rank", i + 1);
    probe__jw_str(w, "id", probe_diag_finding_name(fd->id));
    probe__jw_str(w, "title", fd->title);
    probe__jw_arr(w, "evidence");
    for (int k = 0; k < fd->n_evidence; k++)
      probe__jw_str(w, NULL, fd->evidence[k]);
    probe__jw_end(w, ']');
    probe__jw_str(w, "next_step", fd->next_step);
    /* true: the rule says its own evidence is weak (force-fp32 for a custom
     * module's NaN with no overflow or flush recorded); false: not marked */
    probe__jw_bool(w, "weak_evidence", fd->weak_evidence);
    probe__jw_end(w, '}');
  }
  probe__jw_end(w, ']');
  probe__jw_str(w, "fp32_candidates", d->fp32_candidates);
  probe__jw_bool(w, "problem", probe_diag_problem(d));
  probe__jw_end(w, '}');
}

probe_status probe_diag_render_json(const probe_diag *d, char **json_out) {
  if (!d || !json_out) return PROBE_ERR_INVALID_ARG;
  probe__jw w;
  probe__jw_init(&w);
  probe__diag_json(&w, NULL, d);
  *json_out = probe__jw_finish(&w);
  return *json_out ? PROBE_OK : PROBE_ERR_NOMEM;
}
