"""The local backend's run: rollout (HF `generate`, or a colocated vLLM on one GPU), update with the
shared learner loop, one process; run directory, checkpoints, signals, evaluation.

For laptops, CI, debugging an environment or template before a GPU run, small studies, and single-GPU
runs with the real training-inference mismatch (`--engine vllm`). The same agent loop, components
and learner loop run inside the Oat backend.
"""

from __future__ import annotations

import dataclasses
import math
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from oat_dppo.agent import (Episode, PromptFormat, Turn, assign_advantages, episode_metrics, play_episodes,
                            uncredited_turn_rate)
from oat_dppo.agent.reply_effect import ModelMovePolicy, held_out_metrics
from oat_dppo.backends.local import checkpoint
from oat_dppo.components import (
    build_envs,
    build_trust_region,
    effective_trust_region_options,
    resolve_template,
)
from oat_dppo.cli import python_command
from oat_dppo import determinism
from oat_dppo import warm_start as warm
from oat_dppo.config import ConfigError, TrainConfig, env_options, to_dict
from oat_dppo.engine import vllm as vllm_engine
from oat_dppo.engine.base import pad_token_id, stop_token_ids
from oat_dppo.engine.hf import HFEngine
from oat_dppo.learner import Learner, LearnerConfig
from oat_dppo.learner.schedule import lr_factor
from oat_dppo.learner.timing import OnTiming
from oat_dppo.models import (
    apply_lora,
    enable_gradient_checkpointing,
    engine_model_source,
    freeze_all_but_top_layers,
    load_policy,
    policy_weights,
)
from oat_dppo.provenance import provenance
from oat_dppo.rundir import RunDir, RunDirError, checkpoint_exists, checkpoint_iteration
from oat_dppo.envs.presets import plays_turns
from oat_dppo.envs.splits import split_seeds
from oat_dppo.seeds import derive_seed, episode_seeds
from oat_dppo.stopping import StopSignals, say, stop_status
from oat_dppo.threads import choose_threads
from oat_dppo.trust_region import requirements

# A response budget that keeps CPU iterations short; presets carry GEM's GPU-sized 4096.
LOCAL_MAX_NEW_TOKENS = 256


# ---------------------------------------------------------------------------------------------
# building the pieces
# ---------------------------------------------------------------------------------------------


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def build_policy(cfg: TrainConfig, device: torch.device):
    """The policy and tokenizer `cfg` asks for, on `device`, with LoRA or partial training applied."""
    dtype = getattr(torch, cfg.dtype)
    model, tokenizer = load_policy(cfg.model, dtype=dtype, seed=cfg.seed)
    model.to(device)
    if cfg.lora_rank > 0:
        model = apply_lora(model, rank=cfg.lora_rank, alpha=cfg.lora_alpha)
    elif cfg.trainable_layers > 0:
        try:
            freeze_all_but_top_layers(model, cfg.trainable_layers)
        except ValueError as e:  # more layers than the model has, or no layer list
            raise ConfigError(str(e)) from None
    if cfg.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    model.eval()
    return model, tokenizer


def resolve_engine(cfg: TrainConfig) -> str:
    """The rollout engine `cfg.engine` means here: "hf" or "vllm" (auto: vllm when it can run)."""
    if cfg.engine == "hf":
        return "hf"
    why = vllm_engine.vllm_unavailable()
    if cfg.engine == "vllm" and why:
        raise ConfigError(f"--engine vllm needs {why}. Or --engine hf --engine-dtype bfloat16: rollouts from a bf16 "
                          f"copy of the learner (a mismatch of vLLM bf16's size).")
    return "hf" if why else "vllm"


def resolve_engine_dtype(cfg: TrainConfig) -> str:
    """The engine dtype `cfg.engine_dtype` means for the resolved engine (auto: bfloat16 for vLLM, the
    learner's own dtype for hf, i.e. sampling from the learner's model itself)."""
    if cfg.engine_dtype != "auto":
        return cfg.engine_dtype
    return "bfloat16" if cfg.engine == "vllm" else cfg.dtype


def build_engine(cfg: TrainConfig, model, tokenizer, prompt: PromptFormat, *, topk: int, scratch: Path):
    """(engine, weight_sync): the rollout engine `cfg.engine` names ("hf" or "vllm", resolved), and
    what must receive the learner's weights after every update (None: the engine shares them).

    hf in the learner's dtype samples with the learner's model itself; in another dtype, with its own
    copy of the policy in that dtype (a precision mismatch of the kind a bf16 inference engine brings)."""
    # The same stop tokens for every engine: EOS, pad and the template's end-of-turn token.
    stops = stop_token_ids(tokenizer, getattr(model, "generation_config", None), prompt.stop_token_ids())
    if cfg.engine == "hf":
        if cfg.engine_dtype == cfg.dtype:
            return HFEngine(model, tokenizer, stop_token_ids=stops), None
        # A plain HF model (no LoRA wrapper, nothing frozen): it receives merged weights under HF names.
        sampler, _ = load_policy(cfg.model, dtype=getattr(torch, cfg.engine_dtype), seed=cfg.seed)
        engine = HFEngine(sampler.to(model.device).eval(), tokenizer, stop_token_ids=stops)
        return engine, engine
    settings = vllm_engine.VLLMSettings(
        gpu_memory_utilization=cfg.vllm_gpu_memory_utilization, dtype=cfg.engine_dtype,
        enforce_eager=cfg.vllm_enforce_eager, max_logprobs=max(20, topk), seed=cfg.seed,
        head_dtype=cfg.vllm_head_dtype, sequences=max(cfg.episodes_per_iteration, cfg.eval_episodes, cfg.test_episodes),
    )
    source = engine_model_source(cfg.model, model, tokenizer, scratch)
    engine = vllm_engine.ColocatedVLLM.launch(source, settings, stop_token_ids=stops)
    return engine, engine


# ---------------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------------


class Interrupted(BaseException):
    """Raised by the signal handler to leave the rollout phase at once. A BaseException, as
    KeyboardInterrupt is: code that turns an Exception into something else (an env's reset or step
    failing becomes an episode's error) must not swallow it."""


class LocalTrainer:
    """One run on the local backend. `run()` trains, logs, evaluates and checkpoints.

    Everything that can fail on bad input (the trust region, the environments, the model, a resumed
    checkpoint) is built here, before `run()` writes anything: a rejected command leaves no run
    directory behind. A new run's directory is created by `run()`; a resumed one must exist.

    For benchmarks: `on_timing(name, seconds)` gets the learner's pieces of every update (`learner.timing`;
    the rollout's are in each iteration's row, `time/generate_s` and `time/env_s`), and `last_turns` holds
    the turns the last iteration trained on.
    """

    def __init__(self, cfg: TrainConfig, run_dir: RunDir | str | Path, *, resume: bool = False, out=None,
                 on_timing: OnTiming | None = None):
        self.cfg = cfg
        self.run_dir_path = run_dir.path if isinstance(run_dir, RunDir) else Path(run_dir)
        self.run_dir = run_dir if isinstance(run_dir, RunDir) else None  # created by run()
        self.resume = resume
        self.out = out if out is not None else sys.stderr  # the stream of now, not of import time
        threads, note = choose_threads(cfg.threads)
        torch.set_num_threads(threads)
        if note:
            print(note, file=self.out)
        self.device = resolve_device(cfg.device)
        cfg.engine = resolve_engine(cfg)
        cfg.engine_dtype = resolve_engine_dtype(cfg)
        # --deterministic: before the model first uses CUDA and before build_engine imports vLLM
        self.pinned = None
        if cfg.deterministic:
            self.pinned = determinism.prepare(seed=cfg.seed, device=self.device, engine=cfg.engine,
                                              threads=cfg.threads)
        # Cheapest checks first: a bad strategy or env id fails before the model loads.
        self.trust_region = build_trust_region(cfg)
        _check_groups_unit(cfg, requirements(self.trust_region).trajectory_sequences)
        self.envs = build_envs(cfg, cfg.episodes_per_iteration, split="train")
        self.eval_envs = build_envs(cfg, cfg.eval_episodes, split="validation") if cfg.eval_every and cfg.eval_episodes else []
        # the test split's, built at the run's end (a math env's pool costs time)
        self.test_envs: list = []
        self.model, self.tokenizer = build_policy(cfg, self.device)
        self.template = resolve_template(cfg, self.model)
        preset = self.envs[0].preset
        self.gamma = cfg.gamma if cfg.gamma is not None else preset.gamma
        self.max_new_tokens = cfg.max_new_tokens or min(preset.max_new_tokens, LOCAL_MAX_NEW_TOKENS)
        self.prompt = PromptFormat(self.tokenizer, self.template, cfg.system_prompt, cfg.response_prefix)
        self.scratch = Path(tempfile.mkdtemp(prefix="oat_dppo-"))  # e.g. a tiny model's files for vLLM
        topk = requirements(self.trust_region).topk
        self.engine, self.weight_sync = build_engine(cfg, self.model, self.tokenizer, self.prompt, topk=topk,
                                                     scratch=self.scratch)
        if self.pinned is not None:  # what --deterministic pinned, the engine's part included: one line
            determinism.check_engine(self.pinned)
            print(self.pinned.note(), file=self.out)
        note = vllm_engine.slow_bf16_note(cfg.engine_dtype) if cfg.engine == "vllm" else None
        if note:
            print(note, file=self.out)
        constant = self.max_new_tokens if cfg.aggregation == "seq_sum_constant_length" else None
        self.learner = Learner(
            self.model,
            self.trust_region,
            LearnerConfig(
                learning_rate=cfg.learning_rate,
                num_ppo_epochs=cfg.num_ppo_epochs,
                mini_batch_size=cfg.mini_batch_size,
                mini_batch_unit=cfg.mini_batch_unit,
                group_size=cfg.group_size,
                micro_batch_size=cfg.micro_batch_size,
                micro_batch_tokens=cfg.micro_batch_tokens,
                logits_chunk_tokens=cfg.logits_chunk_tokens,
                max_grad_norm=cfg.max_grad_norm,
                aggregation=cfg.aggregation,
                constant_length=constant,
                mu_source=cfg.mu_source,
            ),
            pad_id=pad_token_id(self.tokenizer),
            device=self.device,
            on_timing=on_timing,
        )
        self.last_turns: list[Turn] = []
        self.start_iteration = 0
        self.best: dict | None = None  # --keep-best: best.json of the policy kept so far
        self.warm_progress: warm.Progress | None = None  # a resumed warm start's (None: none in progress)
        self.warm_saved_steps = 0  # the supervised steps the newest warm-start checkpoint holds
        self.warm_learner = None  # the supervised learner, built only while a warm start runs
        if resume:
            self._load_checkpoint()
            self.best = checkpoint.read_best(RunDir(self.run_dir_path, create=False).best_path)
        self.sync_engine(full=True)  # the engine loaded its weights from disk; the learner's may differ
        self.writer = None
        self._phase = "setup"
        self._stop_requested = False
        self._evaluation_due = False  # this iteration ends with a held-out evaluation
        self._stop_signal = 0  # the signal that stopped the run (0: none, or Ctrl-C as KeyboardInterrupt)
        self._noted_one_step = False

    @property
    def finished(self) -> bool:
        """Every iteration of --iterations is done (a resumed run with nothing left to do; a new run with
        --iterations 0 still takes its warm start)."""
        return bool(self.resume) and self.start_iteration >= self.cfg.iterations and self.warm_progress is None

    def effective_config(self) -> dict:
        """The run's configuration with every default resolved to the value in use (trust-region
        parameters, gamma, token budget, template, engine), plus the version and commit that ran it."""
        out = to_dict(self.cfg)
        out.update(effective_trust_region_options(self.cfg, self.trust_region))
        out.update(gamma=self.gamma, max_new_tokens=self.max_new_tokens, template=self.template)
        blind = self.envs[0].feedback_blind_success  # success above it needs the env's replies
        out["_feedback_blind_success"] = blind if math.isfinite(blind) else None  # "_": derived, not an option
        if self.pinned is not None:
            out["_deterministic_not_pinned"] = self.pinned.not_pinned
        out.update(provenance())
        return out

    def sync_engine(self, *, full: bool = False) -> float:
        """Load the learner's weights into a separate rollout engine (vLLM, which also resets its prefix
        cache, or an HF copy in another dtype); `full`: every weight, else only those an update changes.
        Seconds (0: the engine shares the learner's weights)."""
        if self.weight_sync is None:
            return 0.0
        full = full or getattr(self.weight_sync, "needs_full_sync", False)
        return self.weight_sync.sync_weights(policy_weights(self.model, trainable_only=not full))

    # -- checkpoints -------------------------------------------------------------------------------
    def save_checkpoint(self, iteration: int) -> None:
        checkpoint.save(self.run_dir.checkpoint_path, iteration=iteration, model=self.model,
                        optimizer=self.learner.optimizer)

    BEST_METRIC = "eval/reward_mean"  # what RL maximizes, on every env (success alone is rare on some)

    def _keep_if_best(self, iteration: int, row: dict) -> None:
        """--keep-best: keep the policy just evaluated if it beat every earlier evaluation of the run."""
        value = row.get(self.BEST_METRIC)
        if not self.cfg.keep_best or value is None or not math.isfinite(value):
            return
        if self.best is None or value > self.best["value"]:
            checkpoint.save_best(self.run_dir.best_path, iteration=iteration, model=self.model,
                                 metric=self.BEST_METRIC, value=value)
            self.best = {"iteration": iteration, "metric": self.BEST_METRIC, "value": value}

    def _load_checkpoint(self) -> None:
        run_dir = RunDir(self.run_dir_path, create=False)
        in_warm_start = checkpoint_iteration(run_dir.checkpoint_path) == warm.IN_PROGRESS
        optimizer = (self._warm_learner() if in_warm_start and self.cfg.warm_start else self.learner).optimizer
        try:
            restored = checkpoint.load(run_dir.checkpoint_path, model=self.model, optimizer=optimizer)
        except checkpoint.CheckpointError as e:
            raise RunDirError(f"cannot resume from {run_dir.path}: no usable checkpoint ({e}). Start a new run, "
                              "or point --resume at a run that saved one.") from None
        if restored.path != run_dir.checkpoint_path:
            print(f"warning: {run_dir.checkpoint_path} is unusable; resumed from {restored.path}", file=self.out)
        self.start_iteration = max(0, restored.iteration + 1)
        self._resumed_from = restored.iteration
        if restored.iteration == warm.IN_PROGRESS:  # the warm start goes on from its last saved step
            self.warm_progress = warm.Progress(**restored.extra["warm_start"])
            self.warm_saved_steps = self.warm_progress.step

    # -- logging -----------------------------------------------------------------------------------
    def _make_writer(self):
        if self.cfg.log == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter  # tensorflow-sized import: only when used

            return SummaryWriter(str(self.run_dir.events_path))
        if self.cfg.log == "wandb":
            try:
                import wandb  # optional: only with --log wandb
            except ImportError:
                raise ConfigError("--log wandb needs the wandb package: pip install wandb") from None
            run = wandb.init(project=self.cfg.wandb_project, config=to_dict(self.cfg), dir=str(self.run_dir.path),
                             name=self.run_dir.path.name, resume="allow")
            return run
        return None

    def _emit(self, row: dict) -> None:
        self.run_dir.log_metrics(row)
        if self.writer is None:
            return
        scalars = {k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "iteration" and math.isfinite(v)}
        if self.cfg.log == "tensorboard":
            for k, v in scalars.items():
                self.writer.add_scalar(k, v, row["iteration"])
            self.writer.flush()
        else:
            self.writer.log(scalars, step=row["iteration"])

    # -- signals -----------------------------------------------------------------------------------
    def _on_signal(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        self._stop_signal = self._stop_signal or signum  # the first one gives the exit status
        # Rollouts and evaluations only read the model: leave at once (the last checkpoint stands).
        # An update, or the write of its metrics and checkpoint, is finished first.
        if self._phase in ("train", "save") and not self._stop_requested:
            self._stop_requested = True
            then = (f" and its held-out evaluation ({len(self.eval_envs)} episodes)"
                    if self._phase == "train" and self._evaluation_due else "")
            say(f"\n{name}: finishing this update{then}, then saving a checkpoint (again to abort now)", self.out)
            return
        raise Interrupted(name)

    # -- the loop ----------------------------------------------------------------------------------
    def _open_run_dir(self) -> RunDir:
        """The run directory, created for a new run (with its effective config.json); a resumed
        run's metrics after the restored checkpoint are trimmed, so the files read as one run."""
        run_dir = RunDir(self.run_dir_path, create=not self.resume)
        if self.resume:
            run_dir.truncate_metrics(self._resumed_from)
        run_dir.write_config(self.effective_config())
        return run_dir

    def run(self) -> int:
        cfg = self.cfg
        if self.finished:
            if self._test_due():  # stopped during its test evaluation
                self.run_dir = RunDir(self.run_dir_path, create=False)
                with StopSignals(lambda sig: self._on_signal(sig, None)):
                    try:
                        self._test_at_end()
                    except (Interrupted, KeyboardInterrupt):
                        self.close()
                        return stop_status(self._stop_signal or signal.SIGINT)
            print(f"nothing to do: {self.run_dir_path} has {self.start_iteration} iterations, and --iterations is "
                  f"{cfg.iterations}; raise --iterations above {self.start_iteration} to train longer", file=self.out)
            self.close()
            return 0
        # Stop signals are handled from before the directory is made (`_on_signal`).
        with StopSignals(lambda sig: self._on_signal(sig, None)):
            bar = None
            last_saved = self.start_iteration - 1
            interrupted = False
            try:
                if self.run_dir is None:
                    self.run_dir = self._open_run_dir()
                self.writer = self._make_writer()
                if (self.start_iteration == 0 and not self.resume) or self.warm_progress is not None:
                    self._before_first_update()
                bar = self._progress_bar()
                t_run = time.perf_counter()
                for iteration in range(self.start_iteration, cfg.iterations):
                    self._evaluation_due = bool(cfg.eval_every and (iteration + 1) % cfg.eval_every == 0 and self.eval_envs)
                    row = self.train_iteration(iteration)
                    if self._evaluation_due:
                        row.update(self.evaluate(iteration))
                    row["wall_time"] = time.perf_counter() - t_run
                    # Metrics, then checkpoint, as one step a signal cannot split. (A hard kill between
                    # the two leaves one metrics line ahead; --resume redoes that iteration and trims it.)
                    self._phase = "save"
                    self._emit(row)
                    self._keep_if_best(iteration, row)
                    if (cfg.save_every and (iteration + 1) % cfg.save_every == 0) or iteration == cfg.iterations - 1 or self._stop_requested:
                        self.save_checkpoint(iteration)
                        last_saved = iteration
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix_str(self._postfix(row))
                    else:  # batch jobs: a text log, one line per iteration
                        print(f"iteration {iteration + 1}/{cfg.iterations}: {self._postfix(row)}, "
                              f"{row['time/iteration_s']:.1f} s", file=self.out, flush=True)
                    if self._stop_requested:
                        raise Interrupted("signal")
                if bar is not None:
                    bar.close()
                    bar = None
                if self._test_due():
                    self._test_at_end()
            except (Interrupted, KeyboardInterrupt):
                if bar is not None:
                    bar.close()
                interrupted = True
            finally:
                self.close()
        if interrupted:
            self._after_interruption(saved=last_saved + 1)
            return stop_status(self._stop_signal or signal.SIGINT)
        if not cfg.keep_checkpoint:
            shutil.rmtree(self.run_dir.checkpoint_path, ignore_errors=True)
        print(f"done: {cfg.iterations} iterations in {self.run_dir.path} "
              f"(plots: {python_command()} -m oat_dppo.plot {self.run_dir.path})", file=self.out)
        if self.best is not None:
            print(f"best held-out policy: iteration {self.best['iteration']} ({self.best['metric']} "
                  f"{self.best['value']:.3f}) in {self.run_dir.best_path} (export it: {python_command()} -m "
                  f"oat_dppo.export {self.run_dir.path} OUT_DIR --best)", file=self.out)
        return 0

    def _after_interruption(self, saved: int) -> None:
        """Say what an interrupted run left. A new run with no checkpoint yet is removed: a resume
        could not continue it."""
        if self.run_dir is None and not self.resume:  # stopped while the directory was being made
            if self.run_dir_path.is_dir():
                RunDir(self.run_dir_path, create=False).discard()
            say("\ninterrupted before the run started: nothing was saved", self.out)
        elif self.run_dir is None:
            say("\ninterrupted before the resumed run started: its directory is as it was", self.out)
        elif not self.resume and not checkpoint_exists(self.run_dir.checkpoint_path):
            self.run_dir.discard()
            say(f"\ninterrupted before the first checkpoint: nothing was saved, and {self.run_dir.path} "
                  "was removed", self.out)
        else:
            at = checkpoint_iteration(self.run_dir.checkpoint_path)
            if at == warm.IN_PROGRESS:  # (saved counts RL iterations: none yet)
                saved_what = (f"the warm start's first {self.warm_saved_steps} of {self.cfg.warm_start_steps} "
                              "supervised steps")
            else:
                saved_what = f"{saved} of {self.cfg.iterations} iterations"
            say(f"\ninterrupted: {saved_what} saved in {self.run_dir.path}\n"
                  f"resume with: {python_command()} -m oat_dppo.main --resume {self.run_dir.path}", self.out)

    def _before_first_update(self) -> None:
        """A new run: its warm start, then one held-out evaluation before any RL update, logged as iteration -1
        (each curve starts where its model started); either is saved as the checkpoint before iteration 0."""
        row = {}
        if self.cfg.warm_start:
            self._phase = "rollout"  # a stop here ends at once: the last warm-start checkpoint (if any) stands
            row.update(self.warm_start())
            self.sync_engine(full=True)
            self._phase = "save"
            self.save_checkpoint(-1)
        if self.cfg.eval_every and self.eval_envs:
            row.update(self.evaluate(-1))
        if row:
            self._phase = "save"
            self._emit({"iteration": -1, **row})
            self._keep_if_best(-1, row)
            if not self.cfg.warm_start:  # (a warm start saved it above)
                # the evaluation is kept: a stop in iteration 0's rollout leaves a run that resumes at iteration 0
                self.save_checkpoint(-1)

    def warm_start(self) -> dict:
        """`--warm-start`: collect the demonstrations, take the supervised steps (`oat_dppo.warm_start`); each
        step's row goes to warm_start.jsonl. Returns the run's `warm_start/...` summary."""
        cfg, t0 = self.cfg, time.perf_counter()
        demos, scored = warm.collect(cfg, engine=self.engine, envs=self.envs, prompt=self.prompt,
                                     max_new_tokens=self.max_new_tokens)
        print(f"warm start: {len(demos)} episodes from {cfg.warm_start} (success {scored.get('success_rate', math.nan):.2f} "
              f"as played), {cfg.warm_start_steps} supervised steps of {cfg.warm_start_batch} turns", file=self.out,
              flush=True)
        path = self.run_dir.path / "warm_start.jsonl"
        progress, self.warm_progress = self.warm_progress, None
        if progress is not None:  # resumed: the steps after the last saved one are taken again
            self.run_dir.truncate_jsonl(path, lambda row: row["step"] < progress.step)
            print(f"warm start: resumed after step {progress.step}", file=self.out, flush=True)
        recent: list[float] = []

        def on_step(row: dict, now: warm.Progress) -> None:
            self.run_dir.append_jsonl(path, [row])
            recent.append(row["nll"])
            if now.step % 10 == 0 or now.step == cfg.warm_start_steps:
                print(f"warm start: step {now.step}/{cfg.warm_start_steps}, nll {np.mean(recent):.3f} (mean of "
                      f"the last {len(recent)} steps)", file=self.out, flush=True)
                recent.clear()
            # (`self` plays its demonstrations with the model in training: a resume could not play them again)
            if now.step % self.WARM_START_SAVE_EVERY == 0 and now.step < cfg.warm_start_steps and cfg.warm_start != "self":
                self._save_warm_start(now)

        summary = warm.supervise(self._warm_learner(), demos, cfg, on_step=on_step, progress=progress)
        self.warm_learner = None  # its optimizer state is not needed by RL
        out = {f"warm_start/{k}": v for k, v in summary.items()}
        out.update({f"warm_start/demo_{k}": scored[k] for k in ("success_rate", "reward_mean") if k in scored})
        out["time/warm_start_s"] = time.perf_counter() - t0
        return out

    def _warm_learner(self):
        if self.warm_learner is None:
            self.warm_learner = warm.warm_learner(self.model, self.cfg, pad_id=pad_token_id(self.tokenizer),
                                                  device=self.device)
        return self.warm_learner

    WARM_START_SAVE_EVERY = 20  # supervised steps between a warm start's checkpoints (what a stop can lose)

    def _save_warm_start(self, progress: warm.Progress) -> None:
        """A checkpoint of the warm start in progress; a stop during the save lands after it."""
        self._phase = "save"
        checkpoint.save(self.run_dir.checkpoint_path, iteration=warm.IN_PROGRESS, model=self.model,
                        optimizer=self.warm_learner.optimizer, extra={"warm_start": dataclasses.asdict(progress)})
        self.warm_saved_steps = progress.step
        self._phase = "rollout"
        if self._stop_requested:
            raise Interrupted("signal")

    def train_iteration(self, iteration: int) -> dict:
        cfg = self.cfg
        t_iter = time.perf_counter()
        lr = cfg.learning_rate * lr_factor(iteration, cfg.iterations, cfg.lr_schedule, cfg.lr_warmup_iterations)
        for group in self.learner.optimizer.param_groups:
            group["lr"] = lr
        self._phase = "rollout"
        seeds = episode_seeds(cfg.seed, iteration, cfg.episodes_per_iteration, cfg.group_size)
        episodes, stats = play_episodes(
            self.engine, self.envs, seeds, self.prompt, max_new_tokens=self.max_new_tokens,
            topk=self.learner.topk, generation_seed=derive_seed(cfg.seed, "gen", iteration),
        )
        control = derive_seed(cfg.seed, "shuffle-advantages", iteration) if cfg.shuffle_advantages else None
        assign_advantages(episodes, cfg.advantage, gamma=self.gamma, episode_balance=cfg.episode_balance,
                          shuffle_seed=control)
        played = [e for e in episodes if e.error is None]
        turns = [t for e in played for t in e.turns]
        episode_ids = [i for i, e in enumerate(played) for _ in e.turns]
        group_ids = [e.seed for e in played for _ in e.turns]  # a group: the episodes played from one seed
        self.last_turns = turns
        self._phase = "train"
        train = self.learner.update(turns, random.Random(derive_seed(cfg.seed, "shuffle", iteration)), episode_ids,
                                    group_ids)
        sync_s = self.sync_engine()  # before the next rollout or evaluation samples from the engine
        self._phase = "log"
        unit, count = (("episodes", len(set(episode_ids))) if cfg.mini_batch_unit in ("episodes", "groups")
                       else ("turns", len(turns)))
        if count <= cfg.mini_batch_size and cfg.num_ppo_epochs == 1 and turns and not self._noted_one_step:
            self._noted_one_step = True  # once a run: a rollout of a few more turns would change nothing
            print(f"note: this rollout has {count} {unit} and --mini-batch-size is {cfg.mini_batch_size}: one "
                  "optimizer step per iteration, so pi is pi_old at every step and the trust region can only act on "
                  "the training-inference mismatch (lower --mini-batch-size for several steps per rollout)",
                  file=self.out)
        row = {"iteration": iteration}
        row.update({f"rollout/{k}": v for k, v in episode_metrics(episodes).items()})
        row["rollout/env_errors"] = stats.env_errors
        row["rollout/context_truncations"] = stats.context_truncations
        row["rollout/uncredited_turn_rate"] = uncredited_turn_rate(episodes)
        row.update({f"train/{k}": v for k, v in train.items() if k not in ("train_seconds",)})
        row["train/lr"] = lr
        gen_tokens = sum(t.num_tokens for t in turns)
        prompt_tokens = sum(len(t.prompt_ids) for t in turns)
        train_s = train.get("train_seconds", 0.0)
        iteration_s = time.perf_counter() - t_iter
        row.update({
            "time/generate_s": stats.generate_seconds,
            "time/env_s": stats.env_seconds,
            "time/train_s": train_s,
            "time/sync_s": sync_s,
            "time/iteration_s": iteration_s,
            "time/other_s": max(0.0, iteration_s - stats.generate_seconds - train_s - sync_s),
            "perf/generated_tokens_per_s": gen_tokens / stats.generate_seconds if stats.generate_seconds else math.nan,
            "perf/train_tokens_per_s": (gen_tokens + prompt_tokens) * cfg.num_ppo_epochs / train_s if train_s else math.nan,
        })
        self._log_episodes(iteration, episodes)
        return row

    def evaluate(self, iteration: int, split: str = "validation") -> dict:
        """Play the split's evaluation episodes with the policy as it is (`oat_dppo.envs.splits`): validation
        as the run goes (`eval/*`), test once at its end (`test/*`)."""
        envs = self.eval_envs if split == "validation" else self._test_envs()
        prefix = "eval" if split == "validation" else split
        self._phase = "rollout"
        t0 = time.perf_counter()
        episodes, stats = play_episodes(
            self.engine, envs, split_seeds(split, len(envs), self.cfg.seed), self.prompt,
            max_new_tokens=self.max_new_tokens, topk=0,
            generation_seed=derive_seed(self.cfg.seed, "eval-gen" if split == "validation" else f"{split}-gen", iteration),
            temperature=self.cfg.eval_temperature,
        )
        scorer = lambda: ModelMovePolicy(self.model, self.tokenizer, self.cfg.response_prefix)  # noqa: E731
        held_out = held_out_metrics(episodes, scorer, max_turns=self.cfg.reply_effect_turns)
        out = {f"{prefix}/{k}": v for k, v in held_out.items()}
        self._phase = "log"
        out[f"{prefix}/env_errors"] = stats.env_errors
        out[f"time/{prefix}_s"] = time.perf_counter() - t0
        out[f"time/{prefix}_generate_s"] = stats.generate_seconds  # the episodes' generation, inside time/eval_s
        return out

    def _test_envs(self) -> list:
        if not self.test_envs:
            self.test_envs = build_envs(self.cfg, self.cfg.test_episodes, split="test")
        return self.test_envs

    def _final_iteration(self) -> int:
        return self.cfg.iterations - 1  # -1: a run of no RL iteration (a warm start alone)

    def _test_due(self) -> bool:
        """The run ends with a test evaluation it has not recorded yet (--test-episodes, --eval-every > 0)."""
        if not (self.cfg.test_episodes and self.cfg.eval_every):
            return False
        done = RunDir(self.run_dir_path, create=False).evaluations("test") if self.run_dir_path.is_dir() else []
        return not any(r.get("iteration") == self._final_iteration() and r.get("policy") == "last" for r in done)

    def _test_at_end(self) -> None:
        """The run's one test evaluation, of its final policy, into evaluations.jsonl."""
        print(f"test evaluation: {self.cfg.test_episodes} episodes of the test split", file=self.out, flush=True)
        out = self.evaluate(self._final_iteration(), split="test")
        metrics = {k[len("test/"):]: v for k, v in out.items() if k.startswith("test/")}
        metrics["seconds"] = out["time/test_s"]
        self._phase = "save"
        self.run_dir.record_evaluation(split="test", iteration=self._final_iteration(), policy="last", metrics=metrics)
        print(f"test: reward {metrics['reward_mean']:.3f} over {int(metrics['episodes'])} episodes "
              f"(success {metrics.get('success_rate', math.nan):.3f})", file=self.out, flush=True)

    def _log_episodes(self, iteration: int, episodes: list[Episode]) -> None:
        rows = []
        for e in episodes[: self.cfg.log_episodes]:
            rows.append({
                "iteration": iteration,
                "seed": e.seed,
                "return": e.episode_return,
                "error": e.error,
                "turns": [
                    {"prompt": t.prompt_text[-4000:], "response": t.response_text, "reward": t.reward,
                     "well_formed": t.well_formed, "advantage": t.advantage, "finish_reason": t.finish_reason}
                    for t in e.turns
                ],
            })
        if rows:
            self.run_dir.append_jsonl(self.run_dir.episodes_path, rows)

    def _progress_bar(self):
        if not self.cfg.progress:
            return None
        return tqdm(total=self.cfg.iterations, initial=self.start_iteration, desc="iterations", unit="it",
                    file=self.out, dynamic_ncols=True)

    @staticmethod
    def _postfix(row: dict) -> str:
        # mismatch: |pi - mu| before the first optimizer step (the engine's alone); |pi-mu|: over all
        # steps, policy drift included (what the trust region sees)
        parts = [f"reward {row.get('rollout/reward_mean', math.nan):.3f}",
                 f"kept {row.get('train/kept_frac', math.nan):.3f}",
                 f"mismatch {row.get('train/mismatch_mean', math.nan):.4f}",
                 f"|pi-mu| {row.get('train/prob_diff_mean', math.nan):.4f}"]
        if "rollout/hint_direction_agreement" in row:
            parts.append(f"hint agreement {row['rollout/hint_direction_agreement']:.2f}")
        if "eval/reply_effect" in row:
            parts.append(f"reply effect {row['eval/reply_effect']:.2f}")
        if "eval/reward_mean" in row:
            parts.append(f"eval {row['eval/reward_mean']:.3f}")
        return ", ".join(parts)

    def close(self) -> None:
        if self.writer is not None:
            if self.cfg.log == "tensorboard":
                self.writer.close()
            else:
                self.writer.finish()
            self.writer = None
        for env in self.envs + self.eval_envs + self.test_envs:
            env.close()
        shutil.rmtree(self.scratch, ignore_errors=True)


def _check_groups_unit(cfg: TrainConfig, trajectory_sequences: bool) -> None:
    """`--mini-batch-unit groups` keeps groups whole, not episodes: refused before the model loads where the learner
    must keep an episode's turns in one micro-batch (`learner.loop.plan_update`), not after the first rollout."""
    if cfg.mini_batch_unit != "groups":
        return
    options = env_options(cfg)
    if options.get("history") == "chat":
        raise ConfigError("--mini-batch-unit groups with --env-option history=chat: an episode's turns train as one "
                          "row, which the groups unit does not keep whole; use --mini-batch-unit episodes")
    if trajectory_sequences and plays_turns(cfg.env, options):
        raise ConfigError(f"--mini-batch-unit groups with --trust-region {cfg.trust_region}, which decides per episode "
                          "on multi-turn episodes (an episode in one micro-batch); use --mini-batch-unit episodes")
