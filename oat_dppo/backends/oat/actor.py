"""`DPPOActor`: an Oat `PPOActor` that plays GEM episodes with the shared agent loop on vLLM.

Oat calls `step` once per learner step with `rollout_batch_size_per_device` placeholder slots; each slot
starts `--group-size` episodes from one environment seed (`oat_dppo.agent.play_episodes`: one batched
vLLM call per turn, mu and its top-K recorded), advantages from the shared `assign_advantages` over whole
groups. Every episode travels whole (`data.DPPOEpisodeData`), every turn it played: nothing is sampled
away, where Oat's multi-turn PPO and GEM's examples subsample turns to a fixed count. Rollout metrics
travel in each item's `info`, which Oat's collector averages into `actor/...`.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import replace
from typing import Sequence

import vllm
from oat.algorithms.ppo import PPOActor
from vllm.lora.request import LoRARequest

from oat_dppo.agent import (EVAL_KEYS, PromptFormat, assign_advantages, episode_metrics, play_episodes,
                            uncredited_turn_rate)
from oat_dppo.agent.reply_effect import Case, cases_from_episodes
from oat_dppo import patches
from oat_dppo.backends.oat.args import to_train_config
from oat_dppo.backends.oat.data import DPPOEpisodeData, episode_data
from oat_dppo.components import build_envs, build_trust_region, resolve_template
from oat_dppo.engine.base import stop_token_ids
from oat_dppo.engine.vllm import VLLMEngine, max_model_len
from oat_dppo.envs.presets import family_of
from oat_dppo.seeds import derive_seed
from oat_dppo.trust_region import requirements

# Rounds of episodes one step may play before it gives up (every episode failing is a broken env).
MAX_ROUNDS = 8

patches.apply()  # in the actor's node process: Oat's CUDA-only lines on a machine without CUDA (no-op with CUDA)


def _weights_checksum(worker) -> str:
    """Runs inside vLLM's worker: a digest of every parameter of the model it samples from."""
    import hashlib

    import torch

    h = hashlib.sha256()
    for name, p in sorted(worker.model_runner.model.named_parameters()):
        h.update(name.encode())
        h.update(p.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


class DPPOActor(PPOActor):
    def init(self, actor_id, save_path):
        args = self.args
        self.cfg = to_train_config(args)
        self.topk = requirements(build_trust_region(self.cfg)).topk
        # Before vLLM is built: requests for more log-probs than max_logprobs are rejected.
        self.vllm_args["max_logprobs"] = max(int(args.vllm_max_logprobs or 20), self.topk)
        super().init(actor_id, save_path)  # vllm.LLM, tokenizer, Oat's sampling params, no oracle
        self.setup_agent()

    def setup_agent(self) -> None:
        """Everything the agent loop needs, from `self.llm`, `self.tokenizer` and `self.args`."""
        args = self.args
        tok = self.tokenizer
        self.prompt = PromptFormat(tok, resolve_template(self.cfg, tok), args.system_prompt, args.response_prefix)
        max_context = args.max_model_len or max_model_len(self.llm)
        # As every engine: EOS, pad and the template's end-of-turn token end a response (vLLM adds the
        # model's generation-config EOS ids itself).
        stop = stop_token_ids(tok, None, self.prompt.stop_token_ids())
        common = dict(max_context=max_context, stop_token_ids=stop)
        self.engine = VLLMEngine(self._generate_tokens, vllm.SamplingParams, temperature=args.temperature,
                                 top_p=args.top_p, top_k=args.top_k, **common)
        self.eval_engine = VLLMEngine(self._generate_tokens, vllm.SamplingParams, temperature=args.eval_temperature,
                                      top_p=args.eval_top_p, top_k=args.eval_top_k, **common)
        self.seed_base = time.time_ns() % (1 << 31) if args.rnd_seed else args.seed
        self.steps_done = 0
        self._env_pools: dict[str, list] = {}  # split -> its envs

    # -- vLLM ------------------------------------------------------------------------------------------
    def _generate_tokens(self, prompts: list, params: list) -> list:
        """`vllm.LLM.generate` on token-id prompts, with Oat's LoRA request (--lora-sync-only) and its
        `generate_mode` flag (the learner waits on it before an asynchronous weight sync)."""
        lora = None
        if getattr(self, "use_lora_req", False) and getattr(self, "lora_path", None):
            lora = LoRARequest(os.path.basename(self.lora_path), hash(self.lora_path), self.lora_path)
        self.generate_mode = True
        try:
            return self.llm.generate(prompts, sampling_params=params, lora_request=lora, use_tqdm=False)
        finally:
            self.generate_mode = False

    def sync_probe(self, prompt_ids: list[int], response_ids: list[int]) -> tuple[list[float], str]:
        """(log mu of each response token given the prompt, from vLLM's prompt log-probs with the synced LoRA if
        any; a digest of vLLM's weights): what the learner's --check-sync compares with its own around a sync."""
        params = vllm.SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
        out = self._generate_tokens([{"prompt_token_ids": list(prompt_ids) + list(response_ids)}], params)[0]
        logps = [float(out.prompt_logprobs[len(prompt_ids) + i][t].logprob) for i, t in enumerate(response_ids)]
        return logps, "/".join(self.llm.collective_rpc(_weights_checksum))

    # -- environments ------------------------------------------------------------------------------------
    def _envs_for(self, n: int, *, split: str) -> list:
        """n envs of the split ("train", "validation", "test"), built once and grown when needed (reset with their
        seeds)."""
        pool = self._env_pools.setdefault(split, [])
        if len(pool) < n:
            for env in pool:
                env.close()
            pool[:] = build_envs(self._env_config(), n, split=split)
        return pool[:n]

    def _env_config(self):
        """The run's config, GEM's math grader in a subprocess (`use_mp`) unless chosen: Oat calls `step`
        from a courier thread, where the grader's SIGALRM fails ("signal only works in main thread")."""
        cfg = self.cfg
        if family_of(cfg.env) in ("math", "eval") and not any(o.startswith("use_mp=") for o in cfg.env_option):
            cfg = replace(cfg, env_option=(*cfg.env_option, "use_mp=true"))
        return cfg

    # -- Oat's entry points ------------------------------------------------------------------------------
    def step(self, prompts: list[str], formatted_prompts: list[str], references: list[str] | None = None):
        assert not self.eval_mode
        return self.ipc_client.serialize_ipc(self.rollout(len(prompts))[0])  # the episodes; their metrics ride in each

    def rollout(self, n_slots: int) -> tuple[list[DPPOEpisodeData], dict[str, float]]:
        """Exactly `n_slots x num_samples` episodes, every turn they played, and their metrics. A round without
        a trainable turn (every env failing) is played again, at most MAX_ROUNDS times."""
        args = self.args
        g, actor_id = max(int(args.num_samples), 1), getattr(self, "actor_id", 0)  # episodes a slot; this actor
        errors: list[str] = []
        for rounds in range(MAX_ROUNDS):
            seeds = [derive_seed(self.seed_base, "oat-train", actor_id, self.steps_done, rounds, s)
                     for s in range(n_slots) for _ in range(g)]
            episodes, stats = play_episodes(
                self.engine, self._envs_for(len(seeds), split="train"), seeds, self.prompt,
                max_new_tokens=args.generate_max_length, topk=self.topk,
                generation_seed=derive_seed(self.seed_base, "oat-gen", actor_id, self.steps_done, rounds),
            )
            control = (derive_seed(self.seed_base, "shuffle-advantages", actor_id, self.steps_done, rounds)
                       if args.shuffle_advantages else None)
            assign_advantages(episodes, args.advantage, gamma=args.gamma, episode_balance=args.episode_balance,
                              shuffle_seed=control)
            trained = [[t for t in e.turns if t.response_ids] if e.error is None else [] for e in episodes]
            errors += stats.error_messages
            if any(trained):
                break
        else:
            raise RuntimeError(f"{MAX_ROUNDS} rounds of {len(seeds)} episodes on {args.env} gave no trainable turn "
                               f"(env errors in the last: {stats.env_errors}; first: {errors[:2]})")
        info = {f"actor/{k}": float(v) for k, v in episode_metrics(episodes).items() if k != "reward_std"}
        info.update({
            "actor/env_errors": float(stats.env_errors), "actor/context_truncations": float(stats.context_truncations),
            "actor/generate_time": stats.generate_seconds, "actor/env_time": stats.env_seconds,
            "actor/rollout_rounds": float(rounds + 1), "actor/turns_trained": float(sum(map(len, trained))),
            "actor/uncredited_turn_rate": uncredited_turn_rate(episodes),  # turns a group baseline left at 0
        })
        self.steps_done += 1
        return [episode_data(turns, ignore_no_eos=args.ignore_no_eos, info=info) for turns in trained], info

    def evaluate_episodes(self, seeds: Sequence[int], split: str = "validation") -> tuple[dict[str, float], list[Case]]:
        """Held-out episodes of the split (validation as the run goes, test at its end) with Oat's eval sampling
        (--eval-temperature/top-p/top-k), no top-K: their metrics and the turns whose reply effect the learner scores
        (`DPPOLearner.held_out`). vLLM's prompt log-probs would cost a whole prompt's forward per scored move (a
        64-episode GuessTheNumber evaluation: over 30 minutes)."""
        args = self.args
        if not (seeds := [int(s) for s in seeds]):
            return {"episodes": 0.0}, []
        episodes, _ = play_episodes(
            self.eval_engine, self._envs_for(len(seeds), split=split), seeds, self.prompt,
            max_new_tokens=args.eval_generate_max_length or args.generate_max_length, topk=0,
            generation_seed=derive_seed(self.seed_base, "oat-eval" if split == "validation" else f"oat-{split}",
                                        self.steps_done),
        )
        m = episode_metrics(episodes)
        return {k: float(m.get(k, math.nan)) for k in EVAL_KEYS}, cases_from_episodes(episodes)


__all__ = ["DPPOActor", "MAX_ROUNDS"]
