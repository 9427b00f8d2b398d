"""The benchmark's figure: eval perplexity against training tokens (a band from the lowest to the highest seed) and
against bytes communicated."""

from recipes.benchmarks.convergence.comparison import seed_curves
from recipes.benchmarks.toolkit.figures import pyplot, save_figure
from recipes.benchmarks.toolkit.stats import interpolate_curve


__all__ = ["plot"]


def plot(results: dict, path: str) -> str:
    plt = pyplot()
    fig, (by_tokens, by_bytes) = plt.subplots(1, 2, figsize=(13, 5))
    for name, m in results["methods"].items():
        if "error" in m:
            continue
        style = {"linestyle": "--"} if name.startswith("adloco_") else {"linewidth": 2.2}
        tokens, ppl = zip(*m["curve"])
        (line,) = by_tokens.plot(tokens, ppl, marker="o", markersize=3, label=name, **style)
        seeds = [c for c in seed_curves(m).values()]
        if len(seeds) > 1:  # the band: lowest and highest seed at each of the mean curve's points
            band = [[interpolate_curve(c, x) for c in seeds] for x in tokens]
            low = [min(v for v in b if v is not None) for b in band]
            high = [max(v for v in b if v is not None) for b in band]
            by_tokens.fill_between(tokens, low, high, color=line.get_color(), alpha=0.15)
        comm, ppl_b = zip(*m["curve_bytes"])
        by_bytes.plot(comm, ppl_b, marker="o", markersize=3, label=name, **style)
    for target in results.get("ppl_targets", []):
        by_tokens.axhline(target, color="grey", linewidth=0.8, linestyle=":")
    by_tokens.set_xlabel("training tokens (all workers); band: lowest to highest seed")
    by_bytes.set_xlabel("bytes communicated (ring all-reduce model; log axis, linear below 1 MB so 0 shows)")
    # Logarithmic above 1 MB; the linear stretch below keeps the points of rounds that sent nothing (0 bytes).
    by_bytes.set_xscale("symlog", linthresh=1e6)
    for ax in (by_tokens, by_bytes):
        ax.set_ylabel("eval perplexity (mean over seeds, geometric)")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    settings = results["settings"]
    seeds = results.get("seeds", [settings["seed"]])
    fig.suptitle(
        f"{settings['preset']} on {settings['data']['corpus']}, {settings['world_size']} workers ({settings['device']}), "
        f"budget {settings['budget_tokens']:,} tokens, H={settings['train']['inner_steps']}, seeds {seeds}"
    )
    return save_figure(fig, path)
