"""
One training loop for a GPT (task=lm) or an encoder classifier (task=classify).
  python train.py config/agnews.py --batch_size=32         a config file, then overrides
  python train.py --out_dir=out-agnews --init_from=resume  continue a run where it stopped
  torchrun --standalone --nproc_per_node=4 train.py config/gpt2.py      DDP on one machine
out_dir gets the best model (model.safetensors + config.json), trainer_state.pt and metrics.jsonl.
"""

import json
import math
import sys
import time
from contextlib import ExitStack, nullcontext
from dataclasses import asdict, replace

import torch
from tqdm import tqdm

from lib import checkpoint
from lib.common import Error, run_script
from lib.data import epochs_line, to_device
from lib.distributed import StepGuard, TrainStep, agreed, keep_freed_memory, parallel, started
from lib.records import RunRecord, Speed, peak_flops, start_wandb
from lib.settings import OPTIONS, check_rules, load_data, make_model, parse
from optim import configure_optimizers


def main(argv):
    """The settings, this process's place in the run, then the run."""
    settings, user_keys = parse(argv, OPTIONS, __doc__)
    resuming = settings.init_from == "resume"
    # init_from a model (GPT-2's or a checkpoint folder): its pattern, and its tokenizer the data's
    fine_tune = settings.init_from not in ("scratch", "resume")
    if fine_tune:
        from lib import finetune

        settings = finetune.kept_pattern(settings, user_keys, OPTIONS)
    if not resuming:  # a resumed run is checked once its saved settings are in
        check_rules(settings, resuming)
    if "--print_config" in argv:
        print(json.dumps(asdict(settings), indent=2))
        return None, {}
    with started(settings.device, settings.deterministic) as run, ExitStack() as held:

        def open_run():
            """(state, settings, data): every rank reads a new run's data, checked before out_dir
            is touched, or a resumed run's state and settings; rank 0 locks out_dir."""
            data = None if resuming else load_data(settings)
            if fine_tune:
                finetune.check_data_tokenizer(settings, data[0].meta)
            if run.master:
                out_dir = checkpoint.run_out_dir(
                    settings.out_dir, resuming, settings.overwrite_out_dir
                )
                held.enter_context(out_dir)
            if not resuming:
                return None, settings, data
            state, resumed = checkpoint.resume(settings, user_keys, OPTIONS)
            check_rules(resumed, resuming)
            return state, resumed, None

        # a refusal on any rank is every rank's one line
        state, settings, data = agreed(run, open_run)
        run = run.resolved(settings.dtype, settings.strategy)
        with StepGuard(run) as guard, checkpoint.what_survives(settings.out_dir):
            return train(settings, run, guard, state, user_keys, data)


def train(cfg, run, guard, state, given, data):
    """The data, the model, the optimizer, then the loop; given: the keys the command set;
    data: a new run's (train, val), None for a resumed run's. -> (the model, the last metrics)."""
    if run.device_type == "cpu":
        keep_freed_memory()  # a step's large tensors reuse pages already in place
    train_data, val_data = data or load_data(cfg)
    if state is not None:
        checkpoint.check_tokenizer_kept(state, cfg.out_dir, train_data.meta, train_data.folder)
    # the settings' last values come with the model: the dataset's vocabulary, a pretrained shape
    loaded = cfg.block_size
    cfg, raw_model = make_model(cfg, train_data.meta, state, given)
    if cfg.block_size < loaded:  # a fine-tune's start reads less: its rows too
        train_data, val_data = load_data(cfg)
    # on the device: DDP's wrapper, or FSDP's shards in place (raw_model then holds this process's)
    model = parallel(raw_model, run, cfg.activation_checkpointing)
    if cfg.dtype == "auto" and run.device_type == "cpu" and not run.distributed:
        from lib.autotune import training_dtype  # the fastest of its options here

        batch = train_data.batch(train_data.rows(cfg.seed, 0, cfg.batch_size))
        run = replace(run, dtype=training_dtype(raw_model, batch))
    # DDP first, then compile: the gradient all-reduce then overlaps the backward pass
    if cfg.compile:
        model = torch.compile(model)
    optimizers, train_step = stepping(model, raw_model, cfg, run)
    step, best, seconds = checkpoint.restore(
        state, optimizers, train_step.scaler, raw_model if run.sharded else None
    )
    resumed_step = None if state is None else step
    epochs = epochs_line(train_data, cfg)
    record, speed, bar = start_records(cfg, run, raw_model, seconds, resumed_step, epochs)
    ctx = train_step.ctx  # the steps' autocast, for evaluations
    metric, goal = train_data.best

    def save():
        """trainer_state.pt, from every rank (FSDP gathers its shards); rank 0 writes."""
        seconds = record.seconds() if run.master else None
        progress = dict(step=step, best=best, seconds=seconds, config=asdict(cfg))
        progress["tokenizer"] = train_data.meta["tokenizer"]  # what a resume checks the data by
        scaler = train_step.scaler
        checkpoint.save_state(cfg.out_dir, raw_model, optimizers, scaler, progress, run)

    first_step = step
    best_step = None
    metrics = {}
    while True:
        # before a due evaluation: torchrun and SLURM kill a stopping job within seconds
        if guard.stop_now():
            bar.close()
            with guard.stopping(step, cfg.out_dir):
                save()
        lr = get_lr(step, cfg)
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                group["lr"] = lr * group.get("lr_scale", 1.0)
        if step % cfg.eval_interval == 0 or step == cfg.max_iters or cfg.eval_only:
            eval_start = time.perf_counter()
            metrics = evaluate_splits(raw_model, (train_data, val_data), cfg, run, ctx)
            if run.master:
                line = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())
                bar.write(f"step {step}: {line}", file=sys.stderr)
                record.log(step, **metrics, lr=lr)
            # the start counts: a run that only gets worse keeps it. Every rank decides alike
            # (the metrics are all-reduced) and takes part in the saves, rank 0 writes
            if not cfg.eval_only:
                if improves(metrics[metric], best, goal):
                    best = metrics[metric]
                    best_step = step
                    save_model(raw_model, cfg, run, train_data, {"step": step, **metrics})
                # no trainer state of the start: init_from's, or the state resumed
                if step > first_step and (best_step == step or cfg.always_save_checkpoint):
                    save()
            # the bar's rate and the logged speed count training steps, not evaluations
            bar.unpause()
            speed.skip(time.perf_counter() - eval_start)
        if step >= cfg.max_iters or cfg.eval_only:
            break

        # each step's global batch comes from (seed, step), its dropout from (seed, rank, step):
        # resume is exact
        rows = train_data.rows(cfg.seed, step, cfg.batch_size * cfg.gradient_accumulation_steps)
        torch.manual_seed(hash((cfg.seed, run.rank, step)))
        batches = micro_batches(train_data, rows, cfg.batch_size, run)
        for batch in batches:
            speed.add(train_data.count(batch), batch["idx"])
        loss_sum, norm = train_step.gradients(batches)
        loss_value, norm_value = guard.gather(loss_sum, norm)  # the step's one sync
        check_finite(loss_value, norm_value, step, train_step.scaler, cfg.out_dir)
        train_step.update()
        step += 1
        bar.update(1)
        if run.master and (step % cfg.log_interval == 0 or step == cfg.max_iters):
            logged = {"train/step_loss": loss_value, "lr": lr, "grad_norm": norm_value}
            log_step(record, bar, step, logged, speed.read(run.world_size), train_data.unit)
    bar.close()
    if run.master:
        done = (first_step, step, record.seconds() - seconds)  # this run's
        finish(cfg.out_dir, record, (metric, best, best_step), done, metrics)
    return raw_model, metrics


# ---------------------------------------------------------------------- the pieces, in order used
def stepping(model, raw_model, cfg, run):
    """(the optimizers of cfg's recipe over raw_model, the TrainStep that drives them)."""
    optimizers = configure_optimizers(
        raw_model,
        cfg.weight_decay,
        cfg.learning_rate,
        (cfg.beta1, cfg.beta2),
        run.device_type,
        cfg.optimizer,
    )
    return optimizers, TrainStep(model, raw_model, optimizers, run, cfg.grad_clip)


def start_records(cfg, run, model, seconds, resumed_step, epochs):
    """(metrics.jsonl's writer on rank 0, else None; the speed meter; the progress bar); rank 0
    says what the run is: the model, where it runs, its passes over the data (epochs)."""
    peak = peak_flops(run.device, run.dtype)
    speed = Speed(model, peak)
    # the steps and their rate on stderr, from rank 0
    bar = tqdm(
        total=cfg.max_iters,
        initial=resumed_step or 0,
        disable=not run.master,
        dynamic_ncols=True,
        file=sys.stderr,
    )
    if not run.master:
        return None, speed, bar
    against = f"; MFU against {peak / 1e12:.3g} TFLOP/s" if peak else ""
    print(
        f"{model.num_params() / 1e6:.2f}M parameters, {run.world_size} process(es) on "
        f"{run.device}, {run.dtype}{against}",
        file=sys.stderr,
    )
    print(epochs, file=sys.stderr)
    wandb_run = start_wandb(cfg, model.num_params()) if cfg.wandb_log else None
    record = RunRecord(cfg.out_dir, asdict(cfg), wandb_run, seconds, resumed_step)
    return record, speed, bar


def get_lr(step, cfg):
    """Linear warmup, then cosine decay to min_lr at lr_decay_iters."""
    if not cfg.decay_lr:
        return cfg.learning_rate
    if step < cfg.warmup_iters:
        return cfg.learning_rate * (step + 1) / (cfg.warmup_iters + 1)
    if step > cfg.lr_decay_iters:
        return cfg.min_lr
    ratio = (step - cfg.warmup_iters) / max(1, cfg.lr_decay_iters - cfg.warmup_iters)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg.learning_rate - cfg.min_lr)


def evaluate_splits(model, splits, cfg, run, ctx):
    """evaluate on the train and val splits: {"train/loss": ..., "val/loss": ..., ...}."""
    return {
        f"{name}/{k}": v
        for name, data in zip(("train", "val"), splits)
        for k, v in evaluate(model, data, cfg, run, ctx).items()
    }


@torch.no_grad()
def evaluate(model, data, cfg, run, ctx):
    """Mean loss (and accuracy) over the same batches every time, shared out over the processes,
    with one host-device sync. Under FSDP every process runs as many forwards as rank 0."""
    model.eval()
    every_row = data.eval_rows(cfg.eval_iters * cfg.batch_size)
    rows = every_row[run.rank :: run.world_size]
    # the rows to run through: under FSDP as many as rank 0's
    span = len(every_row[:: run.world_size]) if run.sharded else len(rows)
    # loss x targets, correct predictions, targets
    sums = torch.zeros(3, device=run.device)
    # a classifier in float32, as classify.py and the playground run it: one accuracy
    precision = nullcontext() if data.labelled else ctx
    for i in range(0, span, cfg.batch_size):
        stand_in = i >= len(rows)
        part = every_row[:1] if stand_in else rows[i : i + cfg.batch_size]
        batch = to_device(data.batch(part), run.device)
        with precision:
            logits, loss = model(**batch)
        if stand_in:
            continue
        # the loss: a mean over the targets it counts (-1 none)
        targets = batch.get("targets", batch.get("labels"))
        counted = (targets >= 0).sum()
        sums[0] += loss.float() * counted
        sums[2] += counted
        if data.labelled:
            sums[1] += (logits.argmax(-1) == batch["labels"]).sum()
    if run.distributed:
        torch.distributed.all_reduce(sums)
    loss_sum, correct, n = sums.tolist()
    model.train()
    loss = loss_sum / n
    if data.labelled:
        return {"loss": loss, "accuracy": correct / n}
    metrics = {"loss": loss, "perplexity": math.exp(min(loss, 50))}
    # nats per token to bits per byte of the split's text: a loss that
    # compares runs across tokenizers
    if data.tokens_per_byte:
        metrics["bpb"] = loss / math.log(2) * data.tokens_per_byte
    return metrics


def improves(value, best, goal):
    """Whether value beats the best so far (None: nothing yet), goal "max" or "min"."""
    return best is None or (value > best if goal == "max" else value < best)


def save_model(model, cfg, run, data, scores):
    """model.safetensors + config.json (its card and scores); every rank takes part, rank 0
    writes."""
    card = checkpoint.model_card(cfg, data.meta)
    checkpoint.save_model(model, cfg.out_dir, run, data.folder, **card, metrics=scores)


def micro_batches(data, rows, batch_size, run):
    """This process's share of a step's rows, in batches of batch_size on its device."""
    share = len(rows) // run.world_size
    mine = rows[run.rank * share : (run.rank + 1) * share]
    return [
        to_device(data.batch(mine[i : i + batch_size]), run.device)
        for i in range(0, share, batch_size)
    ]


def check_finite(loss, norm, step, scaler, out_dir):
    """Error on a NaN or inf loss or gradient norm (fp16's scaler skips such steps itself)."""
    if not math.isfinite(loss) or not (scaler.is_enabled() or math.isfinite(norm)):
        raise Error(
            f"loss {loss}, gradient norm {norm} at step {step}: stopping; the last checkpoint in "
            f"{out_dir} is untouched (try a lower learning_rate, or dtype=float32)"
        )


def log_step(record, bar, step, logged, reading, unit):
    """A step's line on the bar and in the records: logged (loss, lr, gradient norm), then the
    speed's reading (rate in units per second; MFU, None on unknown devices)."""
    rate, mfu = reading
    line = f"loss {logged['train/step_loss']:.4f}, lr {logged['lr']:.2e}, {rate:,.0f} {unit}/s"
    logged[f"{unit}/s"] = rate
    if mfu is not None:
        line += f", mfu {100 * mfu:.1f}%"
        logged["mfu"] = mfu
    bar.set_postfix_str(line)
    record.log(step, **logged)


def finish(out_dir, record, best, done, metrics):
    """The run's summary on stderr and in wandb; best: (its metric, value, step in this run);
    done: (first step, last step, seconds) of this run."""
    metric, best, best_step = best
    first_step, step, seconds = done
    line = f"done: {step - first_step} steps in {seconds:.1f} s"
    if first_step:  # resumed
        line += f", resumed from step {first_step} ({record.seconds():.1f} s in all)"
    lines = [line]
    if best_step == 0 and step:
        lines.append(
            f"no step beat the start's {metric} {best:.4f}: "
            f"{out_dir}/model.safetensors holds the start's weights"
        )
    elif best_step is not None:
        lines.append(
            f"best {metric} {best:.4f} at step {best_step}: "
            f"{out_dir}/model.safetensors + config.json"
        )
    elif metrics and best is not None:
        lines.append(
            f"no better {metric} than before ({best:.4f}): {out_dir}/model.safetensors unchanged"
        )
    lines.append(
        f"records: {out_dir}/metrics.jsonl (python plot.py {out_dir}); "
        f"state: {out_dir}/trainer_state.pt"
    )
    print("\n".join(lines), file=sys.stderr)
    if record.wandb:
        record.wandb.summary[f"best {metric}"] = best
        record.wandb.finish()


def script():
    main(sys.argv[1:])


if __name__ == "__main__":
    run_script(script, "train.py")
