"""deploy/grafana/envserver.json: a dashboard Grafana can import, whose every query names metrics,
labels and label values a real host exports (read from its /metrics after a real session).

No Grafana or Prometheus runs here: the PromQL is read by a small tokenizer (metric selectors,
their matchers, and the labels of ``by``/``without``/``on``/``ignoring``), enough for the
dashboard's queries and strict about what it cannot read.
"""

from __future__ import annotations

import copy
import json
import re
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from helpers import ROOT, wait_for_text
from prometheus_client.parser import text_string_to_metric_families

from envserver import client
from envserver.host.metrics import METRIC_NAMES
from envserver.testing import start_host

DASHBOARD = ROOT / "deploy" / "grafana" / "envserver.json"
TIMEOUT_S = 60
#: Every panel and target queries the datasource the dashboard's variable picks.
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
#: Labels Prometheus attaches to every series it scrapes: not on /metrics, always in Prometheus.
TARGET_LABELS = frozenset({"instance", "job"})
#: Variables Grafana defines itself.
GRAFANA_VARIABLES = frozenset({"__rate_interval", "__interval", "__range", "__all"})
#: Sample suffixes of a counter, a histogram or a summary: the family is the name without them.
FAMILY_SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")
#: PromQL words that are neither metrics nor labels.
KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan"}
    | {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values"}
    | {"bottomk", "topk", "quantile", "limitk", "limit_ratio"}
)
#: Keywords followed by a parenthesised list of label names.
GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
TOKEN = re.compile(
    r"""(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
    |(?P<variable>\$\{\w+(?::\w+)?\}|\$\w+|\[\[\w+\]\])
    |(?P<number>(?:\d+(?:ms|[smhdwy]))+|0x[0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
    |(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)
    |(?P<op>=~|!~|!=|==|>=|<=|[-+*/%^=<>(){}\[\],@])
    |(?P<space>\s+|\#[^\n]*)""",
    re.VERBOSE,
)
MATCH_OPS = frozenset({"=", "!=", "=~", "!~"})


@dataclass
class Selector:
    """One metric a query reads, with the matchers written in its braces."""

    metric: str
    matchers: dict[str, tuple[str, str]] = field(default_factory=dict)  # label: (op, value)


@dataclass
class Query:
    """What a PromQL expression refers to."""

    selectors: list[Selector]
    labels: set[str]  # in matchers and in by/without/on/ignoring/group_* lists
    variables: set[str]  # Grafana's $names


def tokens(expr: str) -> list[tuple[str, str]]:
    """The expression as (kind, text) tokens, spaces and comments left out."""
    found, position = [], 0
    while position < len(expr):
        match = TOKEN.match(expr, position)
        if match is None:
            raise ValueError(f"cannot read {expr!r} at {position}: {expr[position:]!r}")
        if match.lastgroup != "space":
            found.append((match.lastgroup, match.group()))
        position = match.end()
    return found


def variable_name(text: str) -> str:
    """``instance`` of ``$instance``, ``${instance}``, ``${instance:regex}`` or ``[[instance]]``."""
    return re.match(r"(?:\$\{?|\[\[)(\w+)", text).group(1)


def parse(expr: str) -> Query:
    """The metrics, labels and Grafana variables a PromQL expression refers to.

    A name is a metric unless it calls (is followed by ``(``), is a PromQL keyword or aggregation,
    or is a label (in braces before a matcher, or listed after ``by``/``without``/...).
    Range and subquery brackets (``[5m]``, ``[$__rate_interval]``) hold no metric.
    """
    toks = tokens(expr)
    query = Query([], set(), set())
    i = 0
    while i < len(toks):
        kind, text = toks[i]
        following = toks[i + 1][1] if i + 1 < len(toks) else ""
        if kind == "variable":
            query.variables.add(variable_name(text))
        elif text == "[":
            close = next(j for j in range(i, len(toks)) if toks[j][1] == "]")
            query.variables |= {variable_name(t) for k, t in toks[i:close] if k == "variable"}
            i = close
        elif kind == "name" and text.lower() in GROUPING and following == "(":
            close = next(j for j in range(i, len(toks)) if toks[j][1] == ")")
            query.labels |= {t for k, t in toks[i + 2 : close] if k == "name"}
            i = close
        elif kind == "name" and following != "(" and text.lower() not in KEYWORDS | GROUPING:
            query.selectors.append(Selector(text))
            if following == "{":
                i = read_matchers(toks, i + 2, query)
        elif text == "{":  # a selector of matchers only: {__name__="..."}
            i = read_matchers(toks, i + 1, query)
        i += 1
    return query


def read_matchers(toks: list[tuple[str, str]], start: int, query: Query) -> int:
    """Reads ``label op "value"`` pairs from ``start`` up to ``}`` into the last selector."""
    i = start
    while toks[i][1] != "}":
        if toks[i][1] == ",":
            i += 1
            continue
        matcher = toks[i : i + 3]
        if [kind for kind, _ in matcher] != ["name", "op", "string"] or (
            matcher[1][1] not in MATCH_OPS
        ):
            raise ValueError(f"cannot read the matcher {' '.join(t for _, t in matcher)!r}")
        (_, label), (_, op), (_, value) = matcher
        value = value[1:-1]
        query.labels.add(label)
        query.variables |= {variable_name(v) for v in re.findall(r"\$\{?\w+\}?", value)}
        if label == "__name__" and op == "=":
            query.selectors.append(Selector(value))
        elif query.selectors:
            query.selectors[-1].matchers[label] = (op, value)
        i += 3
    return i


def metric_family(name: str) -> str:
    """The family a sample name belongs to: ``x_bucket``, ``x_sum``, ``x_total`` ... are ``x``."""
    for suffix in FAMILY_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def load_dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def graph_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """The panels that query (rows only lay them out)."""
    return [panel for panel in dashboard["panels"] if panel["type"] != "row"]


def variable_queries(dashboard: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(variable, metric, label) of each ``label_values(metric, label)`` query variable."""
    found = []
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            text = variable["query"]["query"]
            match = re.fullmatch(r"label_values\(\s*(\w+)\s*,\s*(\w+)\s*\)", text)
            assert match, f"variable {variable['name']}: cannot read {text!r}"
            found.append((variable["name"], match.group(1), match.group(2)))
    return found


Exported = dict[str, list[dict[str, str]]]


def exported_samples(text: str) -> Exported:
    """Every sample name of a /metrics page, with the label sets of its samples."""
    samples: Exported = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample.labels)
    return samples


def problems(dashboard: dict[str, Any], exported: Exported) -> list[str]:
    """What the dashboard queries that the host does not export, each naming its panel."""
    found = []
    uses = [
        (f"variable {name}", Selector(metric), {label})
        for name, metric, label in variable_queries(dashboard)
    ]
    for panel in graph_panels(dashboard):
        for target in panel["targets"]:
            query = parse(target["expr"])
            legend = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")))
            for selector in query.selectors:
                uses.append((f"panel {panel['title']!r}", selector, query.labels | legend))
    for where, selector, labels in uses:
        name = selector.metric
        if name not in exported:
            found.append(f"{where}: metric {name} (family {metric_family(name)}) is not exported")
            continue
        label_sets = exported[name]
        for label in sorted(labels - TARGET_LABELS):
            if not any(label in sample for sample in label_sets):
                found.append(f"{where}: metric {name} has no label {label}")
        for label, (op, value) in selector.matchers.items():
            values = {sample.get(label) for sample in label_sets}
            if op == "=" and label not in TARGET_LABELS and value not in values:
                found.append(f"{where}: metric {name} has no {label}={value!r}")
    return found


# ---- the PromQL reader ------------------------------------------------------------------------


def test_parse_tells_metrics_from_functions_keywords_labels_and_variables():
    expr = (
        "histogram_quantile(0.99, sum by (le, command) (rate("
        'envserver_request_duration_seconds_bucket{instance=~"$instance", command="step"}'
        "[$__rate_interval])))"
    )
    query = parse(expr)
    assert [s.metric for s in query.selectors] == ["envserver_request_duration_seconds_bucket"]
    assert query.selectors[0].matchers == {
        "instance": ("=~", "$instance"),
        "command": ("=", "step"),
    }
    assert query.labels == {"le", "command", "instance"}
    assert query.variables == {"instance", "__rate_interval"}


def test_parse_reads_binary_operators_offsets_numbers_and_matching():
    expr = (
        "sum without (status) (increase(envserver_requests_total[5m:1m] offset 1h)) / on (instance)"
        ' group_left max(envserver_sessions{job!="x"}) > bool 1e3 and topk(3, up)'
    )
    query = parse(expr)
    assert [s.metric for s in query.selectors] == [
        "envserver_requests_total",
        "envserver_sessions",
        "up",
    ]
    assert query.labels == {"status", "instance", "job"}
    assert parse('{__name__="envserver_envs"}').selectors[0].metric == "envserver_envs"


def test_parse_refuses_what_it_cannot_read():
    with pytest.raises(ValueError, match="cannot read"):
        parse("sum(rate(envserver_env_steps_total[5m])) ; drop")
    with pytest.raises(ValueError, match="cannot read the matcher"):
        parse("envserver_envs{instance}")


def test_metric_family_drops_sample_suffixes():
    assert metric_family("envserver_request_duration_seconds_bucket") == (
        "envserver_request_duration_seconds"
    )
    assert metric_family("envserver_request_duration_seconds_count") == (
        "envserver_request_duration_seconds"
    )
    assert metric_family("envserver_env_steps_total") == "envserver_env_steps"
    assert metric_family("envserver_sessions") == "envserver_sessions"


def test_problems_name_the_panel_and_the_missing_metric_or_label():
    exported = {"envserver_requests_total": [{"command": "step", "status": "ok"}]}
    panel = {
        "title": "Broken",
        "type": "timeseries",
        "targets": [{"expr": 'sum by (reason) (rate(envserver_env_step_total{command="x"}[1m]))'}],
    }
    dashboard = {"panels": [panel], "templating": {"list": []}}
    assert problems(dashboard, exported) == [
        "panel 'Broken': metric envserver_env_step_total (family envserver_env_step) "
        "is not exported"
    ]
    panel["targets"][0]["expr"] = (
        'sum by (reason) (rate(envserver_requests_total{command="x", status="ok"}[1m]))'
    )
    assert problems(dashboard, exported) == [
        "panel 'Broken': metric envserver_requests_total has no label reason",
        "panel 'Broken': metric envserver_requests_total has no command='x'",
    ]


# ---- the dashboard's structure ----------------------------------------------------------------


def test_dashboard_is_an_importable_json_model():
    dashboard = load_dashboard()
    assert dashboard["id"] is None  # Grafana assigns it on import
    assert dashboard["title"] and re.fullmatch(r"[\w-]{8,40}", dashboard["uid"])
    assert isinstance(dashboard["schemaVersion"], int)
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), f"panel ids repeat: {ids}"
    boxes = []
    for panel in dashboard["panels"]:
        title = panel.get("title")
        assert title, f"panel {panel['id']} has no title"
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) for k in "xywh"), title
        assert grid["x"] + grid["w"] <= 24 and grid["w"] > 0 and grid["h"] > 0, title
        cells = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                 for y in range(grid["y"], grid["y"] + grid["h"])}  # fmt: skip
        for other, taken in boxes:
            assert not cells & taken, f"panels {other!r} and {title!r} overlap"
        boxes.append((title, cells))


def test_every_panel_queries_the_datasource_variable_and_sets_its_unit():
    dashboard = load_dashboard()
    for panel in graph_panels(dashboard):
        title = panel["title"]
        assert panel["datasource"] == DATASOURCE, f"panel {title!r}: not the datasource variable"
        assert panel["fieldConfig"]["defaults"]["unit"], f"panel {title!r} has no unit"
        assert panel["targets"], f"panel {title!r} has no query"
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), title
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, f"panel {title!r}: a query's datasource"
            assert target["expr"].strip(), f"panel {title!r}: an empty query"


def test_templating_has_a_prometheus_datasource_and_a_multi_host_variable():
    dashboard = load_dashboard()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    source = variables["datasource"]
    assert source["type"] == "datasource" and source["query"] == "prometheus"
    hosts = variables["instance"]
    assert hosts["type"] == "query" and hosts["datasource"] == DATASOURCE
    assert hosts["multi"] and hosts["includeAll"]
    assert variable_queries(dashboard) == [("instance", "envserver_sessions", "instance")]
    assert hosts["definition"] == hosts["query"]["query"]


def test_every_query_selects_the_chosen_hosts_and_uses_defined_variables():
    dashboard = load_dashboard()
    defined = {v["name"] for v in dashboard["templating"]["list"]} | GRAFANA_VARIABLES
    for panel in graph_panels(dashboard):
        for target in panel["targets"]:
            query = parse(target["expr"])
            assert query.selectors, f"panel {panel['title']!r}: no metric in {target['expr']!r}"
            for selector in query.selectors:
                assert selector.matchers.get("instance") == ("=~", "$instance"), (
                    f"panel {panel['title']!r}: {selector.metric} ignores the Host variable"
                )
            unknown = query.variables - defined
            assert not unknown, f"panel {panel['title']!r}: undefined variables {unknown}"


def panel_families(dashboard: dict[str, Any]) -> set[str]:
    """The metric families the dashboard's panels query."""
    return {
        metric_family(selector.metric)
        for panel in graph_panels(dashboard)
        for target in panel["targets"]
        for selector in parse(target["expr"]).selectors
    }


def test_every_metric_a_host_exports_has_a_panel():
    missing = {metric_family(name) for name in METRIC_NAMES} - panel_families(load_dashboard())
    assert not missing, f"no panel shows {sorted(missing)}"


# ---- against a real host ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A real host's /metrics page once a CartPole session has reset, stepped and closed on it."""
    host = start_host(
        tmp_path_factory.mktemp("grafana"), "--metrics-port", "0", bind="tcp://127.0.0.1:*"
    )
    try:
        log = wait_for_text(host.log_text, "metrics on http://", TIMEOUT_S)
        url = re.search(r"metrics on (http://\S+)", log).group(1)
        envs = client.make_vec("CartPole-v1", num_envs=2, hosts=[host.endpoint])
        try:
            envs.reset(seed=0)
            for _ in range(3):
                envs.step(np.zeros(2, dtype=np.int64))
        finally:
            envs.close()
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            return response.read().decode()
    finally:
        host.stop()


def test_a_host_exports_every_metric_label_and_value_the_dashboard_queries(scraped):
    assert "\nenvserver_env_steps_total 6.0\n" in scraped  # the session: 3 steps of 2 envs
    found = problems(load_dashboard(), exported_samples(scraped))
    assert not found, "\n".join(found)


def test_every_envserver_metric_on_a_real_hosts_page_has_a_panel(scraped):
    # What /metrics serves, not only METRIC_NAMES (a metric added without a name there too).
    served = {
        metric_family(name) for name in exported_samples(scraped) if name.startswith("envserver_")
    }
    assert {"envserver_drains", "envserver_envs_moved"} <= served
    missing = served - panel_families(load_dashboard())
    assert not missing, f"no panel shows {sorted(missing)}"


def test_a_wrong_metric_in_the_dashboard_is_caught_and_named(scraped):
    exported = exported_samples(scraped)
    dashboard = load_dashboard()
    known = set(problems(dashboard, exported))  # none, unless the test above fails too
    dashboard = copy.deepcopy(dashboard)
    panel = next(p for p in graph_panels(dashboard) if p["title"] == "Env steps/s per host")
    target = panel["targets"][0]
    target["expr"] = target["expr"].replace("envserver_env_steps_total", "envserver_env_step_total")
    assert set(problems(dashboard, exported)) - known == {
        "panel 'Env steps/s per host': metric envserver_env_step_total "
        "(family envserver_env_step) is not exported"
    }
