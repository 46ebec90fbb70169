"""PNG plots of a ``moriio bench`` result (matplotlib, Agg backend, imported on use)."""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path
from typing import Any

PLOT_EXTRA = "pip install 'moriio[plot]'"
TRANSPORT_PNG = "transport_throughput.png"
PLANNER_PNG = "planner_cost.png"
SCHEDULER_PNG = "scheduler_cost.png"


def plots_unavailable() -> str | None:
    """Why PNG plots cannot be written (matplotlib is missing), or None when they can."""
    if find_spec("matplotlib") is None:
        return f"--out writes PNG plots with matplotlib, which is not installed: {PLOT_EXTRA}"
    return None


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path, title: str | None = None, **layout: Any) -> None:
    """Title ``fig``, lay it out (``layout``: ``tight_layout``'s arguments), write it, free it."""
    if title is not None:
        fig.suptitle(title)
    fig.tight_layout(**layout)
    fig.savefig(path, dpi=110)
    pyplot().close(fig)


def plot_transport(transport: dict[str, Any], path: Path) -> bool:
    """Throughput vs block size (READ of permuted blocks) next to a numpy gather."""
    rows = transport.get("sweep") or []
    if not rows:
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    sizes = [r["block_size"] // 1024 for r in rows]
    ax.plot(sizes, [r["gbps"] for r in rows], "o-", label="NIXL READ, permuted blocks")
    ax.plot(sizes, [r["memcpy_gbps"] for r in rows], "s--", label="numpy gather, same blocks")
    if transport.get("memcpy_gbps"):
        ax.axhline(transport["memcpy_gbps"], color="grey", ls=":", label="np.copyto, contiguous")
    if transport.get("gbps"):
        ax.axhline(transport["gbps"], color="C2", ls="-.", label="NIXL READ, contiguous")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [f"{s} KiB" if s < 1024 else f"{s // 1024} MiB" for s in sizes])
    ax.tick_params(axis="x", labelrotation=45)
    ax.set_xlabel("block size")
    ax.set_ylabel("GB/s")
    total = transport.get("sweep_total_bytes", 0) >> 20
    ax.set_title(f"Loopback throughput vs block size ({total} MiB per batch)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, path)
    return True


def plot_planner(planner: dict[str, Any], path: Path) -> bool:
    """Per-layer plan cost and 61-layer READ request cost, per layout (log scale)."""
    layouts: dict[str, dict[str, Any]] = planner.get("layouts") or {}
    if not layouts:
        return False
    plt = pyplot()
    names = list(layouts)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    panels = (
        ("one layer, 2048 random blocks", "us_per_plan", "vllm_us_per_plan", "naive_us_per_plan"),
        (
            f"{planner.get('num_layers', 61)}-layer READ request",
            "request_61_layers_us",
            "vllm_request_61_layers_us",
            "naive_request_61_layers_us",
        ),
    )
    width = 0.27
    for ax, (title, ours, vllm, naive) in zip(axes, panels, strict=True):
        for i, (key, label) in enumerate(
            ((ours, "moriio"), (vllm, "vLLM in-tree"), (naive, "naive loop"))
        ):
            values = [layouts[n].get(key) or 0.0 for n in names]
            xs = [j + (i - 1) * width for j in range(len(names))]
            ax.bar(xs, values, width, label=label)
        ax.set_xticks(range(len(names)), names)
        ax.set_yscale("log")
        ax.set_ylabel("microseconds")
        ax.set_title(title)
        ax.grid(alpha=0.3, axis="y")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3)
    save_figure(fig, path, "Transfer planning cost (lower is better)", rect=(0, 0.07, 1, 1))
    return True


def plot_scheduler(scheduler: dict[str, Any], path: Path) -> bool:
    """Connector cost per scheduler step vs live transferring requests."""
    rows = scheduler.get("series") or []
    if not rows:
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    live = [r["live_requests"] for r in rows]
    ax.plot(live, [r.get("us_per_step") for r in rows], "o-", label="moriio")
    ax.plot(live, [r.get("vllm_us_per_step") for r in rows], "s--", label="vLLM in-tree")
    ax.set_xlabel("live transferring requests")
    ax.set_ylabel("microseconds per step")
    ax.set_title("Scheduler-side connector cost per step")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, path)
    return True


def write_plots(result: dict[str, Any], out_dir: Path) -> list[Path]:
    """Every plot the result has data for, written into ``out_dir``; the paths written."""
    written = []
    for section, name, plot in (
        ("transport", TRANSPORT_PNG, plot_transport),
        ("planner", PLANNER_PNG, plot_planner),
        ("scheduler", SCHEDULER_PNG, plot_scheduler),
    ):
        data = result.get(section)
        if isinstance(data, dict) and plot(data, out_dir / name):
            written.append(out_dir / name)
    return written
