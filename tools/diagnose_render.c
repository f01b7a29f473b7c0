/*
 * tools/diagnose_render.c - renders a probe_diag: a text report for people
 * (sections: trace, first non-finite event, loss scaler, clipping, gradient
 * underflow, diagnosis) and the same content as JSON through jansson.
 */
#include <math.h>
#include <string.h>

#include "cli.h"
#include "diagnose.h"

static void fmt_num(char *b, size_t n, double x) {
  if (isnan(x))
    snprintf(b, n, "nan");
  else if (isinf(x))
    snprintf(b, n, "%sinf", x < 0 ? "-" : "");
  else
    snprintf(b, n, "%.6g", x);
}

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

void probe_diag_print_text(const probe_diag *d, FILE *f) {
  char a[32], b[32];
  fprintf(f, "trace       %s\n", d->path);
  fprintf(f, "status      %s; %s; %lld steps (%lld..%lld), ",
          d->complete ? "complete" : "INCOMPLETE (writer did not close it)",
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
  if (d->precision_policy[0])
    fprintf(f, "precision   %s\n", d->precision_policy);
  fmt_num(a, sizeof a, d->first_loss);
  fmt_num(b, sizeof b, d->last_loss);
  fprintf(f, "loss        %s -> %s", a, b);
  if (d->first_nonfinite_loss_step >= 0)
    fprintf(f, "; first non-finite loss at step %lld (%lld non-finite)",
            (long long)d->first_nonfinite_loss_step,
            (long long)d->nonfinite_loss_steps);
  fprintf(f, "\n\n");

  fprintf(f, "FIRST NON-FINITE EVENT\n");
  if (d->event == DIAG_EVENT_NONE) {
    fprintf(f, "  none in the forward pass, the weights or the loss\n");
    if (d->first_grad_overflow_step >= 0)
      fprintf(f, "  (scaled gradients overflowed first at step %lld; the "
                 "scaler skipped those steps, as designed)\n",
              (long long)d->first_grad_overflow_step);
  } else {
    fprintf(f, "  step        %lld\n", (long long)d->event_step);
    fprintf(f, "  phase       %s\n", probe_phase_name(d->event_phase));
    if (d->event == DIAG_EVENT_OVERFLOW && d->origin_layer >= 0 &&
        d->layers[d->origin_layer].info.precision == PROBE_PREC_FP32)
      fprintf(f, "  kind        %s: finite values overflowed to inf (the "
                 "layer runs in FP32: past 3.4e38)\n",
              diag_event_name(d->event));
    else
      fprintf(f, "  kind        %s: %s\n", diag_event_name(d->event),
              diag_event_desc(d->event));
    if (d->origin_layer >= 0) {
      fprintf(f, "  origin      %s (%s, %s) at %s: %llu NaN, %llu +inf, %llu "
                 "-inf of %llu\n",
              diag_layer_name(d, d->origin_layer),
              probe_kind_name(d->layers[d->origin_layer].info.kind),
              probe_precision_name(d->layers[d->origin_layer].info.precision),
              probe_site_name(d->origin_site),
              (unsigned long long)d->origin_out.nan_count,
              (unsigned long long)d->origin_out.posinf_count,
              (unsigned long long)d->origin_out.neginf_count,
              (unsigned long long)d->origin_out.count);
      if (d->have_origin_in) {
        fmt_num(a, sizeof a, d->origin_in.absmax);
        fprintf(f, "  its input   finite: absmax %s, %llu zeros, %llu "
                   "would flush in FP16, of %llu\n",
                a, (unsigned long long)d->origin_in.zero_count,
                (unsigned long long)d->origin_in.f16_flush,
                (unsigned long long)d->origin_in.count);
      }
      if (d->feeder_layer >= 0)
        fprintf(f, "  fed by      %s (%s)\n",
                diag_layer_name(d, d->feeder_layer),
                probe_kind_name(d->layers[d->feeder_layer].info.kind));
    }
    if (d->n_passed) {
      fprintf(f, "  passed on   ");
      for (int i = 0; i < d->n_passed; i++)
        fprintf(f, "%s%s", i ? ", " : "", diag_layer_name(d, d->passed[i]));
      if (d->more_passed) fprintf(f, " and %d more", d->more_passed);
      fprintf(f, "\n");
    }
    if (d->nan_from_inf_layer >= 0)
      fprintf(f, "  NaN made    in %s from inf (inf-inf or 0*inf)\n",
              diag_layer_name(d, d->nan_from_inf_layer));
    if (d->n_history == 1 && d->history[0].step == d->event_step) {
      fprintf(f, "  history     none: the event is in the first step recorded"
                 "\n");
    } else if (d->n_history > 0) {
      fprintf(f, "  history of %s (absmax, headroom log2(65504/absmax)):\n",
              diag_layer_name(d, d->origin_layer));
      for (int i = 0; i < d->n_history; i++) {
        fmt_num(a, sizeof a, d->history[i].absmax);
        fmt_num(b, sizeof b, d->history[i].headroom);
        fprintf(f, "    step %-8lld absmax %-12s headroom %s\n",
                (long long)d->history[i].step, a, b);
      }
    }
  }
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
    for (int i = 0; i < d->n_backoff_detail; i++) {
      const diag_backoff *bk = &d->backoff_detail[i];
      fprintf(f, "  backoff     step %lld: %g -> %g", (long long)bk->step,
              bk->old_scale, bk->new_scale);
      if (bk->n_layers) {
        fprintf(f, "; non-finite gradients in ");
        for (int k = 0; k < bk->n_layers; k++)
          fprintf(f, "%s%s", k ? ", " : "", diag_layer_name(d, bk->layers[k]));
        if (bk->more_layers) fprintf(f, " +%d", bk->more_layers);
      }
      fprintf(f, "\n");
    }
    int64_t shown = d->n_backoff_detail;
    if (d->backoffs + d->min_clamps > shown)
      fprintf(f, "  ...         %lld more backoffs\n",
              (long long)(d->backoffs + d->min_clamps - shown));
  }
  fprintf(f, "\n");

  fprintf(f, "CLIPPING\n");
  if (!d->clipping_on) {
    fprintf(f, "  off\n");
  } else if (d->clip_steps_seen == 0) {
    fprintf(f, "  threshold   %g; no finite gradient norm in the trace\n",
            d->clip_threshold);
  } else {
    fprintf(f, "  threshold   %g; %lld of %lld steps clipped; largest ratio "
               "norm/threshold %.4g at step %lld\n",
            d->clip_threshold, (long long)d->clipped_steps,
            (long long)d->clip_steps_seen, d->max_clip_ratio,
            (long long)d->max_clip_ratio_step);
    fprintf(f, "  ratio over time (mean/max per window):");
    for (int i = 0; i < DIAG_TIME_BUCKETS; i++)
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
    const diag_layer *l = &d->layers[i];
    uint64_t c0 = l->grad_count[0], c1 = l->grad_count[1];
    if (!c0 && !c1) continue;
    char u0[16], u1[16], z[16];
    fmt_pct(u0, sizeof u0, frac(l->grad_subnormal[0], c0));
    fmt_pct(u1, sizeof u1, frac(l->grad_subnormal[1], c1));
    fmt_pct(z, sizeof z, frac(l->grad_zero[0] + l->grad_zero[1], c0 + c1));
    fprintf(f, "  %-24s %7s -> %7s   zeros %7s\n", l->info.name, u0, u1, z);
    shown_l++;
  }
  if (!shown_l) fprintf(f, "  no gradient records of FP16 layers\n");
  fprintf(f, "\n");

  fprintf(f, "DIAGNOSIS (most likely first)\n");
  for (int i = 0; i < d->n_findings; i++) {
    const diag_finding *fd = &d->findings[i];
    fprintf(f, "  %d. [%s] %s\n", i + 1, diag_finding_name(fd->id), fd->title);
    for (int k = 0; k < fd->n_evidence; k++)
      fprintf(f, "     - %s\n", fd->evidence[k]);
    fprintf(f, "     next: %s\n", fd->next_step);
  }
}

/* ---- JSON ----------------------------------------------------------------- */

static json_t *stats_json(const probe_stats *s) {
  json_t *o = json_object();
  json_object_set_new(o, "count", json_integer((json_int_t)s->count));
  json_object_set_new(o, "nan", json_integer((json_int_t)s->nan_count));
  json_object_set_new(o, "posinf", json_integer((json_int_t)s->posinf_count));
  json_object_set_new(o, "neginf", json_integer((json_int_t)s->neginf_count));
  json_object_set_new(o, "zeros", json_integer((json_int_t)s->zero_count));
  json_object_set_new(o, "f16_flush", json_integer((json_int_t)s->f16_flush));
  json_object_set_new(o, "absmax", cli_json_num(s->absmax));
  return o;
}

static json_t *layer_ref(const probe_diag *d, int32_t id) {
  if (id < 0) return json_null();
  return json_string(diag_layer_name(d, id));
}

json_t *probe_diag_to_json(const probe_diag *d) {
  json_t *root = json_object();
  json_t *tr = json_object();
  json_object_set_new(tr, "path", json_string(d->path));
  json_object_set_new(tr, "complete", json_boolean(d->complete));
  json_object_set_new(tr, "record_mode",
                      json_string(d->record_mode == PROBE_MODE_FULL
                                      ? "full"
                                      : "flight-recorder"));
  json_object_set_new(tr, "steps", json_integer(d->n_steps));
  json_object_set_new(tr, "first_step", json_integer(d->first_step));
  json_object_set_new(tr, "last_step", json_integer(d->last_step));
  json_object_set_new(tr, "records", json_integer(d->n_records));
  json_object_set_new(tr, "layers", json_integer(d->n_layers));
  json_object_set_new(tr, "precision_policy", json_string(d->precision_policy));
  json_object_set_new(root, "trace", tr);

  json_t *loss = json_object();
  json_object_set_new(loss, "first", cli_json_num(d->first_loss));
  json_object_set_new(loss, "last", cli_json_num(d->last_loss));
  json_object_set_new(loss, "min", cli_json_num(d->min_loss));
  json_object_set_new(loss, "first_nonfinite_step",
                      d->first_nonfinite_loss_step >= 0
                          ? json_integer(d->first_nonfinite_loss_step)
                          : json_null());
  json_object_set_new(loss, "nonfinite_steps",
                      json_integer(d->nonfinite_loss_steps));
  json_object_set_new(root, "loss", loss);

  json_t *ev = json_object();
  json_object_set_new(ev, "kind", json_string(diag_event_name(d->event)));
  json_object_set_new(ev, "description",
                      json_string(diag_event_desc(d->event)));
  if (d->event != DIAG_EVENT_NONE) {
    json_object_set_new(ev, "step", json_integer(d->event_step));
    json_object_set_new(ev, "phase",
                        json_string(probe_phase_name(d->event_phase)));
    json_object_set_new(ev, "origin_layer", layer_ref(d, d->origin_layer));
    if (d->origin_layer >= 0) {
      json_object_set_new(
          ev, "origin_kind",
          json_string(probe_kind_name(d->layers[d->origin_layer].info.kind)));
      json_object_set_new(ev, "origin_site",
                          json_string(probe_site_name(d->origin_site)));
      json_object_set_new(ev, "origin_output", stats_json(&d->origin_out));
      if (d->have_origin_in)
        json_object_set_new(ev, "origin_input", stats_json(&d->origin_in));
    }
    json_object_set_new(ev, "fed_by", layer_ref(d, d->feeder_layer));
    json_t *pa = json_array();
    for (int i = 0; i < d->n_passed; i++)
      json_array_append_new(pa, json_string(diag_layer_name(d, d->passed[i])));
    json_object_set_new(ev, "passed_on", pa);
    json_object_set_new(ev, "nan_from_inf_layer",
                        layer_ref(d, d->nan_from_inf_layer));
    json_t *h = json_array();
    for (int i = 0; i < d->n_history; i++) {
      json_t *p = json_object();
      json_object_set_new(p, "step", json_integer(d->history[i].step));
      json_object_set_new(p, "absmax", cli_json_num(d->history[i].absmax));
      json_object_set_new(p, "headroom", cli_json_num(d->history[i].headroom));
      json_array_append_new(h, p);
    }
    json_object_set_new(ev, "history", h);
  }
  json_object_set_new(ev, "first_gradient_overflow_step",
                      d->first_grad_overflow_step >= 0
                          ? json_integer(d->first_grad_overflow_step)
                          : json_null());
  json_object_set_new(root, "event", ev);

  json_t *sc = json_object();
  json_object_set_new(sc, "enabled", json_boolean(d->scaling_on));
  json_object_set_new(sc, "enabled_source",
                      json_string(d->scaling_from_config ? "config"
                                                         : "loss-scale"));
  json_object_set_new(sc, "scale_first", cli_json_num(d->scale_first));
  json_object_set_new(sc, "scale_last", cli_json_num(d->scale_last));
  json_object_set_new(sc, "scale_min", cli_json_num(d->scale_min));
  json_object_set_new(sc, "scale_max", cli_json_num(d->scale_max));
  json_object_set_new(sc, "backoffs", json_integer(d->backoffs));
  json_object_set_new(sc, "late_backoffs", json_integer(d->late_backoffs));
  json_object_set_new(sc, "growths", json_integer(d->growths));
  json_object_set_new(sc, "hysteresis", json_integer(d->hysteresis_events));
  json_object_set_new(sc, "min_clamps", json_integer(d->min_clamps));
  json_object_set_new(sc, "skipped_steps", json_integer(d->skipped_steps));
  json_object_set_new(sc, "longest_skip_run", json_integer(d->longest_skip_run));
  json_object_set_new(sc, "longest_skip_start",
                      json_integer(d->longest_skip_start));
  json_object_set_new(sc, "collapsed", json_boolean(d->scale_collapsed));
  json_t *bo = json_array();
  for (int i = 0; i < d->n_backoff_detail; i++) {
    const diag_backoff *bk = &d->backoff_detail[i];
    json_t *o = json_object();
    json_object_set_new(o, "step", json_integer(bk->step));
    json_object_set_new(o, "old_scale", cli_json_num(bk->old_scale));
    json_object_set_new(o, "new_scale", cli_json_num(bk->new_scale));
    json_t *ls = json_array();
    for (int k = 0; k < bk->n_layers; k++)
      json_array_append_new(ls, json_string(diag_layer_name(d, bk->layers[k])));
    json_object_set_new(o, "nonfinite_grad_layers", ls);
    json_array_append_new(bo, o);
  }
  json_object_set_new(sc, "backoff_detail", bo);
  json_object_set_new(root, "scaler", sc);

  json_t *cl = json_object();
  json_object_set_new(cl, "enabled", json_boolean(d->clipping_on));
  if (d->clipping_on) {
    json_object_set_new(cl, "threshold", cli_json_num(d->clip_threshold));
    json_object_set_new(cl, "clipped_steps", json_integer(d->clipped_steps));
    json_object_set_new(cl, "steps", json_integer(d->clip_steps_seen));
    json_object_set_new(cl, "max_ratio", cli_json_num(d->max_clip_ratio));
    json_object_set_new(cl, "max_ratio_step",
                        json_integer(d->max_clip_ratio_step));
    json_t *bk = json_array();
    for (int i = 0; i < DIAG_TIME_BUCKETS; i++) {
      if (!d->bucket_n[i]) continue;
      json_t *o = json_object();
      json_object_set_new(o, "first_step", json_integer(d->bucket_first_step[i]));
      json_object_set_new(o, "steps", json_integer(d->bucket_n[i]));
      json_object_set_new(o, "mean_ratio", cli_json_num(d->bucket_ratio_mean[i]));
      json_object_set_new(o, "max_ratio", cli_json_num(d->bucket_ratio_max[i]));
      json_array_append_new(bk, o);
    }
    json_object_set_new(cl, "ratio_over_time", bk);
  }
  json_object_set_new(cl, "corr_log_norm_log_scale",
                      cli_json_num(d->corr_norm_scale));
  json_object_set_new(cl, "norm_over_scale", cli_json_num(d->norm_over_scale));
  json_object_set_new(cl, "norm_compared_steps", json_integer(d->clip_norm_steps));
  json_object_set_new(cl, "norm_scaled_steps", json_integer(d->clip_norm_scaled_steps));
  json_object_set_new(cl, "clips_scaled_gradients",
                      json_boolean(d->clip_scaled_signature));
  json_object_set_new(root, "clipping", cl);

  json_t *uf = json_array();
  for (int64_t i = 0; i < d->n_layers; i++) {
    const diag_layer *l = &d->layers[i];
    uint64_t c0 = l->grad_count[0], c1 = l->grad_count[1];
    if (!c0 && !c1) continue;
    json_t *o = json_object();
    json_object_set_new(o, "layer", json_string(l->info.name));
    json_object_set_new(o, "kind", json_string(probe_kind_name(l->info.kind)));
    json_object_set_new(
        o, "subnormal_or_flush_first_half",
        cli_json_num(frac(l->grad_subnormal[0], c0)));
    json_object_set_new(
        o, "subnormal_or_flush_second_half",
        cli_json_num(frac(l->grad_subnormal[1], c1)));
    json_object_set_new(
        o, "zero_fraction",
        cli_json_num(frac(l->grad_zero[0] + l->grad_zero[1], c0 + c1)));
    json_object_set_new(o, "min_forward_headroom",
                        cli_json_num(l->min_fwd_headroom));
    json_object_set_new(o, "origin_steps", json_integer(l->origin_steps));
    json_object_set_new(o, "backoff_steps", json_integer(l->backoff_steps));
    json_array_append_new(uf, o);
  }
  json_object_set_new(root, "layers", uf);

  json_t *dg = json_array();
  for (int i = 0; i < d->n_findings; i++) {
    const diag_finding *fd = &d->findings[i];
    json_t *o = json_object();
    json_object_set_new(o, "rank", json_integer(i + 1));
    json_object_set_new(o, "id", json_string(diag_finding_name(fd->id)));
    json_object_set_new(o, "title", json_string(fd->title));
    json_t *evd = json_array();
    for (int k = 0; k < fd->n_evidence; k++)
      json_array_append_new(evd, json_string(fd->evidence[k]));
    json_object_set_new(o, "evidence", evd);
    json_object_set_new(o, "next_step", json_string(fd->next_step));
    json_array_append_new(dg, o);
  }
  json_object_set_new(root, "diagnosis", dg);
  json_object_set_new(root, "fp32_candidates", json_string(d->fp32_candidates));
  json_object_set_new(root, "problem", json_boolean(probe_diag_problem(d)));
  return root;
}
