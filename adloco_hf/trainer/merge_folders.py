"""The model folders a run writes besides its checkpoints: a merge's `merges/outer-N/` during training (pushed to
the Hub with `push_to_hub=True`), and the global weights of any folder as a `from_pretrained` folder with its card;
the parts that write their cards and upload them, with what they read of the trainer."""

import functools
import os

from ..checkpoint.folders import save_errors, save_global_weights, save_model_folder
from ..reporting.run_cards import RunCards, RunView
from ..reporting.run_hub import RunHub
from ..rounds.log_lines import merge_record
from ..rounds.state import RoundResult


__all__ = ["reporting_parts", "save_global_weights_folder", "save_merge"]


def save_global_weights_folder(trainer, folder: str, phi, *, title: str, extra: dict | None = None) -> str:
    """Save flat global weights as a `from_pretrained` folder with a model card (on the writing rank). With
    worker_parallelism="fsdp", `phi` is the full state dict already gathered (`Worker.full_save_state`)."""
    card = trainer.cards.render(folder, title)
    model = trainer.accelerator.unwrap_model(trainer.model)
    if isinstance(phi, dict):
        return save_model_folder(
            folder, model, state_dict=phi, processing_class=trainer.processing_class, card=card, extra_files=extra
        )
    return save_global_weights(
        folder,
        model,
        trainer.worker.global_model.views_of(phi),
        processing_class=trainer.processing_class,
        card=card,
        extra_files=extra,
    )


def save_merge(trainer, result: RoundResult) -> None:
    """`merges/outer-N/` on global rank 0, pushed to the Hub with `push_to_hub=True`."""
    merge, round_number = result.merge, result.lines[0].outer_step
    folder = os.path.join(trainer.args.output_dir, "merges", f"outer-{round_number}")
    info = merge_record(merge.plan, round_number)
    title = f"AdLoCo merge at round {round_number}"
    with save_errors(folder, trainer.args.output_dir, trainer.worker.monitor.report):
        save_global_weights_folder(trainer, folder, merge.phi, title=title, extra={"adloco_merge.json": info})
    if trainer.args.push_to_hub:
        # A failed upload is retried, then logged at WARNING: training goes on, the merge is on disk.
        trainer.hub.push_during_training(
            folder, path_in_repo=f"merges/outer-{round_number}", commit_message=f"Merge at round {round_number}"
        )


def reporting_parts(trainer) -> tuple[RunCards, RunHub]:
    """The cards of the run's folders and its Hub uploads, with what they read of `trainer` and its worker."""
    worker = trainer.worker
    run = RunView(
        args=trainer.args,
        model=lambda: trainer.accelerator.unwrap_model(trainer.model),
        processing_class=trainer.processing_class,
        is_writer=trainer.is_world_process_zero,
        summary=worker.summary,
        max_batch_size=lambda: worker.max_batch_size,
        views_of=lambda phi: worker.global_model.views_of(phi),
        save_weights=functools.partial(save_global_weights_folder, trainer),
    )
    cards = RunCards(run, hub_location=lambda folder: hub.location(folder))
    hub = RunHub(run, cards, hub_model_id=lambda: trainer.hub_model_id)
    return cards, hub
