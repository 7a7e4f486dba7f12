"""Plots one or several runs from their TensorBoard logs: loss (train solid, eval dashed), eval loss per mix source,
learning rate, grad norm, tokens/s and MFU against tokens seen, runs overlaid with a legend. A resumed run is one
curve (a step logged twice keeps its last value). PNGs go to eval/<RUN_NAME>/plots/ (several runs:
eval/<A>_vs_<B>/plots/); scripts/export_model.py puts loss.png in the model card.
"""

RUNS = ["demo"]  # run names (folders under LOGS_DIR) or paths of TensorBoard log folders
LOGS_DIR = "logs"  # where run names are looked up
EVAL_DIR = "eval"  # PNGs go to EVAL_DIR/<RUN_NAME>/plots/


def main() -> None:
    from sparknet.common import runtime
    from sparknet.common.errors import UserError
    from sparknet.common.outputs import check_outputs
    from sparknet.eval.reports import comparison_name, eval_dir, eval_outputs

    if not RUNS:
        raise UserError("no runs: set RUNS to a list of run names")
    folders = []
    for run in RUNS:
        # resolved: "logs/run/" and "logs/run/x/.." are the run, named by its folder (never "..": beside EVAL_DIR)
        folder = (runtime.project_path(run) if "/" in run else runtime.project_path(LOGS_DIR) / run).resolve()
        if not folder.is_dir():
            raise UserError(f"no TensorBoard logs for run {run!r} (looked for {folder})")
        folders.append(folder)
    names = [folder.name for folder in folders]
    check_outputs(*eval_outputs(names, EVAL_DIR, "plots", names_from="RUNS"))
    runtime.setup(0)
    from sparknet.eval.plots import plot_runs  # matplotlib and tensorboard: only once the input is known good

    out = eval_dir(comparison_name(names) if len(names) > 1 else names[0], EVAL_DIR) / "plots"
    for path in plot_runs(folders, out):
        print(path)


if __name__ == "__main__":
    from sparknet.config.cli import run_script

    run_script(globals(), main)
