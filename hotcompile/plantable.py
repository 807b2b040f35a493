"""The per-layer plan as a readable table: ``print(hotcompile.plans())``.

One formatter for every place that shows plans (``hotcompile.plans()`` in a REPL, the demo
and its CLI command): the rows are :meth:`hotcompile.passes.LayerPlan.describe`, so a column
means the same wherever it is printed, and the table ends with a legend of the paths it shows
(``gx_only`` or ``inference`` are not self-explanatory).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hotcompile.passes.rewrite import PATHS, LayerPlan

#: (header, ``LayerPlan.describe()`` key) of the table's columns, in order. ``reason`` is
#: describe's ``note``: why a layer is not ``hot`` (every ``skipped``, ``gx_only``,
#: ``inference`` and ``exact`` row has one), else a note on a ``hot`` row (HLA turned off by a
#: plan, g_y's codes made by another kernel)
COLUMNS: tuple[tuple[str, str], ...] = (
    ("layer", "layer"),
    ("op", "kind"),
    ("weight", "weight"),
    ("path", "path"),
    ("g_x", "g_x"),
    ("g_w", "g_w"),
    ("forward", "forward"),
    ("recipe", "recipe"),
    ("speed-up", "speed-up"),
    ("reason", "note"),
)

#: what an empty table prints
EMPTY = (
    "no layer plans recorded: a model compiled with backend='hot' records its plans when it is "
    "first called (hotcompile.clear_plans() forgets them)"
)


def plan_rows(plans: Iterable[LayerPlan], dedupe: bool = False) -> list[dict[str, Any]]:
    """The table's rows (dicts keyed by the headers of :data:`COLUMNS`), in plan order.

    ``dedupe``: one row per (layer, path), the first seen — a model recompiled for a new
    shape or the last, smaller batch plans its layers again, identically. Without it every
    plan is a row, with a ``graph`` column (the backend's graph index) when the plans come
    from more than one graph, so that a recompile or an inference graph is told apart."""
    plans = list(plans)
    graphs = not dedupe and len({p.graph for p in plans}) > 1
    rows, seen = [], set()
    for p in plans:
        d = p.describe()
        key = (d["layer"], d["path"])
        if dedupe and key in seen:
            continue
        seen.add(key)
        row = {"graph": p.graph} if graphs else {}
        row.update({header: d[col] for header, col in COLUMNS})
        rows.append(row)
    return rows


def format_plans(plans: Iterable[LayerPlan], dedupe: bool = False, legend: bool = True) -> str:
    """The plans as a text table (GitHub markdown, readable as is), a summary line and, with
    ``legend``, what each path in it means. ``dedupe``: as :func:`plan_rows`."""
    from tabulate import tabulate

    plans = list(plans)
    if not plans:
        return EMPTY
    rows = plan_rows(plans, dedupe)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["path"]] = counts.get(row["path"], 0) + 1
    graphs = len({p.graph for p in plans})
    where = f" in {graphs} graphs" if graphs > 1 and not dedupe else ""
    summary = f"{len(rows)} linear/conv layer plans{where}: " + ", ".join(
        f"{n} {path}" for path, n in counts.items()
    )
    lines = [tabulate(rows, headers="keys", tablefmt="github"), summary]
    if legend:
        lines += [f"  {path}: {PATHS[path]}" for path in PATHS if path in counts]
    return "\n".join(lines)


class PlanTable(list):
    """A list of :class:`~hotcompile.passes.LayerPlan` (what :func:`hotcompile.plans`
    returns) that prints as a table.

    It stays a plain list for code (indexing, iteration, ``==``, ``len``): only ``str()`` and
    ``repr()`` differ, because a REPL prints ``repr`` and a list of dataclasses there was
    ~900 characters a layer. :meth:`rows` gives the table's cells for programs."""

    def __getitem__(self, index: Any) -> Any:
        """An item, or a slice as a PlanTable (``plans()[-4:]`` prints as a table too)."""
        item = super().__getitem__(index)
        return PlanTable(item) if isinstance(index, slice) else item

    def rows(self, dedupe: bool = False) -> list[dict[str, Any]]:
        """The table's rows as dicts (:func:`plan_rows`)."""
        return plan_rows(self, dedupe)

    def table(self, dedupe: bool = False, legend: bool = True) -> str:
        """The text table (:func:`format_plans`)."""
        return format_plans(self, dedupe, legend)

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        return self.table()

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        """IPython: the table, not IPython's own list printer."""
        p.text("PlanTable(...)" if cycle else self.table())
