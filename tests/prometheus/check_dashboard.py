#!/usr/bin/env python3
"""Checks conf/grafana/idemgate.json: its shape (importable with a Prometheus data source chosen
for ${DS_PROMETHEUS}) and that every PromQL expression in it parses.

    check_dashboard.py DASHBOARD.json PROMTOOL

Every panel target's `expr` and every `label_values(...)` selector of a template variable, with
Grafana's variables replaced by sample values, becomes a recording rule in a temporary file that
`PROMTOOL check rules` must accept. Exit status: 0 when everything passed, 1 otherwise.
"""

import json
import os
import re
import subprocess
import sys
import tempfile

DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
# Grafana's built-in interval variables, as Grafana would fill them in.
BUILTINS = {"__rate_interval": "1m", "__interval": "30s", "__range": "1h"}


def fail(errors, message):
    errors.append(message)


def panels_of(dashboard):
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])  # panels inside a collapsed row


def substitute(expr, variables):
    """expr with $name, ${name} and [[name]] replaced; raises KeyError for an unknown one."""
    def value(match):
        name = match.group(1) or match.group(2) or match.group(3)
        if name in BUILTINS:
            return BUILTINS[name]
        return variables[name]
    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]", value, expr)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    path, promtool = sys.argv[1], sys.argv[2]
    with open(path, encoding="utf-8") as f:
        dashboard = json.load(f)
    errors = []

    if not isinstance(dashboard.get("schemaVersion"), int) or dashboard["schemaVersion"] < 36:
        fail(errors, "schemaVersion must be an integer ≥ 36")
    inputs = {i.get("name"): i for i in dashboard.get("__inputs", [])}
    if inputs.get("DS_PROMETHEUS", {}).get("pluginId") != "prometheus":
        fail(errors, "__inputs needs DS_PROMETHEUS of pluginId prometheus")

    # Template variables: the data source one, and query variables filled with a match-all regex.
    variables = {}
    selectors = []
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "datasource":
            continue
        if var.get("datasource") != DATASOURCE:
            fail(errors, f"variable {var.get('name')}: datasource must be {DATASOURCE}")
        variables[var["name"]] = ".*"
        query = var.get("query")
        query = query.get("query", "") if isinstance(query, dict) else query or ""
        m = re.fullmatch(r"\s*label_values\((.*),\s*\w+\)\s*", query)
        if m:
            selectors.append((f"variable {var['name']}", m.group(1)))

    exprs = []
    ids = set()
    for panel in panels_of(dashboard):
        title = panel.get("title", "?")
        if panel.get("type") == "row":
            continue
        if panel.get("id") in ids:
            fail(errors, f"panel {title}: id {panel.get('id')} is used twice")
        ids.add(panel.get("id"))
        if panel.get("datasource") != DATASOURCE:
            fail(errors, f"panel {title}: datasource must be {DATASOURCE}")
        if not {"x", "y", "w", "h"} <= set(panel.get("gridPos", {})):
            fail(errors, f"panel {title}: gridPos needs x, y, w, h")
        targets = panel.get("targets", [])
        if not targets:
            fail(errors, f"panel {title}: no targets")
        for target in targets:
            if target.get("datasource", DATASOURCE) != DATASOURCE:
                fail(errors, f"panel {title}: target datasource must be {DATASOURCE}")
            if not target.get("expr"):
                fail(errors, f"panel {title}: target {target.get('refId')} has no expr")
                continue
            exprs.append((f"panel {title} target {target.get('refId')}", target["expr"]))

    rules = []
    for where, expr in selectors + exprs:
        try:
            rules.append({"record": f"dashboard:expr{len(rules)}",
                          "expr": substitute(expr, variables),
                          "labels": {"source": where}})
        except KeyError as e:
            fail(errors, f"{where}: unknown variable {e} in {expr}")
    if not exprs:
        fail(errors, "no expressions found")

    with tempfile.TemporaryDirectory() as tmp:
        rules_path = os.path.join(tmp, "dashboard_rules.yaml")
        with open(rules_path, "w", encoding="utf-8") as f:
            json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, f, indent=1)
        check = subprocess.run([promtool, "check", "rules", rules_path],
                               capture_output=True, text=True)
        sys.stdout.write(check.stdout + check.stderr)
        if check.returncode != 0:
            fail(errors, "promtool rejected an expression; the rules are:\n" + "\n".join(
                f"  {r['record']}: {r['labels']['source']}: {r['expr']}" for r in rules))

    for e in errors:
        print("error:", e, file=sys.stderr)
    print(f"{len(exprs)} panel expressions and {len(selectors)} variable selectors checked, "
          f"{len(errors)} errors")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
