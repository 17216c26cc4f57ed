"""Launch verl GRPO with Sparring's self-play agent loop, and merge its checkpoint to HF.

    from sparring.verl_backend.launch import VerlConfig, verl_command, merge_command
    cmd = verl_command(VerlConfig(), "Qwen/Qwen2.5-0.5B-Instruct", "train.parquet",
                       "val.parquet", "runs/verl", "runs/verl/agent_loops.yaml")
    subprocess.run(cmd, check=True)               # python -m verl.trainer.main_ppo ...
    subprocess.run(merge_command("runs/verl/ckpt", "runs/verl/hf"), check=True)

One pod with `n_gpus_per_node` GPUs runs this as is. Multi-node: start a Ray cluster (KubeRay
RayJob) and submit the same command as the job entrypoint with `nnodes` set; verl joins the
running cluster through RAY_ADDRESS.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

from sparring.verl_backend.config import AGENT_NAME, ESTIMATOR_NAME, LOOP_MANAGER, VerlConfig

__all__ = [
    "VerlConfig",
    "latest_actor_dir",
    "merge_command",
    "verl_command",
    "verl_overrides",
    "write_agent_loop_config",
]


def write_agent_loop_config(path: str | Path, cfg: VerlConfig) -> Path:
    """The YAML verl reads from `rollout.agent.agent_loop_config_path` (extra keys become
    constructor arguments of the loop)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {
        "name": AGENT_NAME,
        "_target_": "sparring.verl_backend.agent_loop.SparringSelfPlayLoop",
        "max_new_tokens": cfg.max_new_tokens,
    }
    path.write_text(yaml.safe_dump([entry], sort_keys=False))
    return path


def verl_overrides(
    cfg: VerlConfig,
    model_path: str,
    train_files: str,
    val_files: str,
    out_dir: str,
    agent_loop_config: str,
) -> list[str]:
    """Hydra overrides for `verl.trainer.main_ppo` (keys of verl's ppo_trainer.yaml; a leading
    `+` adds a key the schema leaves open)."""
    actor, rollout = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    kl = cfg.kl_coef > 0
    ray = [f"ray_kwargs.ray_init.num_cpus={cfg.ray_num_cpus}"] if cfg.ray_num_cpus else []
    return [
        *ray,
        "trainer.use_v1=True",  # the manager below subclasses the V1 trainer's
        f"algorithm.adv_estimator={ESTIMATOR_NAME}",  # GRPO over extra_info.group_key
        f"+{rollout}.agent.agent_loop_manager_class={LOOP_MANAGER}",  # hands it the labels
        f"algorithm.norm_adv_by_std_in_grpo={cfg.norm_adv_by_std}",
        "algorithm.use_kl_in_reward=False",
        f"data.train_files={train_files}",
        f"data.val_files={val_files}",
        "data.prompt_key=prompt",
        "data.return_raw_chat=True",
        f"data.train_batch_size={cfg.train_batch_size}",
        f"data.max_prompt_length={cfg.max_prompt_length}",
        f"data.max_response_length={cfg.max_response_length}",
        f"actor_rollout_ref.model.path={model_path}",
        f"{actor}.optim.lr={cfg.lr}",
        f"{actor}.ppo_mini_batch_size={cfg.ppo_mini_batch_size}",
        f"{actor}.ppo_micro_batch_size_per_gpu={cfg.micro_batch_size_per_gpu}",
        f"{actor}.use_kl_loss={kl}",
        f"{actor}.kl_loss_coef={cfg.kl_coef}",
        f"{actor}.kl_loss_type=low_var_kl",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={cfg.micro_batch_size_per_gpu}",
        f"{rollout}.name=sglang",
        f"{rollout}.mode=async",
        f"{rollout}.n={cfg.rollout_n}",
        f"{rollout}.tensor_model_parallel_size={cfg.tp_size}",
        f"{rollout}.gpu_memory_utilization={cfg.gpu_memory_utilization}",
        f"{rollout}.log_prob_micro_batch_size_per_gpu={cfg.micro_batch_size_per_gpu}",
        f"{rollout}.multi_turn.enable=True",
        f"{rollout}.agent.default_agent_loop={AGENT_NAME}",
        f"{rollout}.agent.agent_loop_config_path={agent_loop_config}",
        f"trainer.n_gpus_per_node={cfg.n_gpus_per_node}",
        f"trainer.nnodes={cfg.nnodes}",
        f"trainer.total_epochs={cfg.total_epochs}",
        f"trainer.save_freq={cfg.save_freq}",
        f"trainer.test_freq={cfg.test_freq}",
        f"trainer.default_local_dir={Path(out_dir) / 'ckpt'}",
        "trainer.resume_mode=auto",
        "trainer.logger=[console,file]",  # file: $VERL_FILE_LOGGER_PATH (JSONL)
        f"trainer.project_name={cfg.project_name}",
        f"trainer.experiment_name={cfg.experiment_name}",
    ]


def verl_command(
    cfg: VerlConfig,
    model_path: str,
    train_files: str,
    val_files: str,
    out_dir: str,
    agent_loop_config: str,
    python: str = sys.executable,
) -> list[str]:
    """The `python -m verl.trainer.main_ppo ...` argv."""
    args = verl_overrides(cfg, model_path, train_files, val_files, out_dir, agent_loop_config)
    return [python, "-m", "verl.trainer.main_ppo", *args]


def latest_actor_dir(ckpt_dir: str | Path) -> Path:
    """`<ckpt_dir>/global_step_<N>/actor` for the largest N."""
    steps = [
        (int(m.group(1)), p)
        for p in Path(ckpt_dir).glob("global_step_*")
        if (m := re.fullmatch(r"global_step_(\d+)", p.name)) and (p / "actor").is_dir()
    ]
    if not steps:
        raise FileNotFoundError(f"no global_step_*/actor checkpoint under {ckpt_dir}")
    return max(steps)[1] / "actor"


def merge_command(
    ckpt_dir: str | Path, target_dir: str | Path, python: str = sys.executable
) -> list[str]:
    """argv merging the latest FSDP actor checkpoint into a Hugging Face checkpoint."""
    return [
        python,
        "-m",
        "verl.model_merger",
        "merge",
        "--backend",
        "fsdp",
        "--local_dir",
        str(latest_actor_dir(ckpt_dir)),
        "--target_dir",
        str(target_dir),
    ]
