/*
 * trainer/scenario.c - the built-in scenario zoo: lookup of the configs that
 * trainer/scenarios.cmake embedded from trainer/scenarios/NAME.json (sorted by
 * name).
 */
#include <jansson.h>
#include <string.h>

#include "trainer-impl.h"

struct pt_scenario_entry {
  const char *name;
  const char *json;
};
extern const struct pt_scenario_entry pt_scenarios[];
extern const size_t pt_scenario_total;

size_t probe_scenario_count(void) { return pt_scenario_total; }

const char *probe_scenario_name(size_t i) {
  return i < pt_scenario_total ? pt_scenarios[i].name : NULL;
}

const char *probe_scenario_json(const char *name) {
  if (!name) return NULL;
  for (size_t i = 0; i < pt_scenario_total; i++)
    if (strcmp(pt_scenarios[i].name, name) == 0) return pt_scenarios[i].json;
  return NULL;
}

/* The descriptions are parsed once per call; a scenario is a few hundred
 * bytes. The returned pointer is to a static per-scenario buffer. */
const char *probe_scenario_description(const char *name) {
  static char desc[64][512];
  for (size_t i = 0; i < pt_scenario_total && i < 64; i++) {
    if (strcmp(pt_scenarios[i].name, name ? name : "") != 0) continue;
    if (!desc[i][0]) {
      json_t *r = json_loads(pt_scenarios[i].json, 0, NULL);
      const char *d = r ? json_string_value(json_object_get(r, "description")) : NULL;
      strncpy(desc[i], d ? d : "", sizeof desc[i] - 1);
      json_decref(r);
    }
    return desc[i];
  }
  return "";
}
