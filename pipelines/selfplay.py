"""The iterative self-play pipeline: game-init once, then per iteration
rollout → train → evaluate → register, unrolled at compile time (KFP v2 has no recursion).

    sparring compile --config configs/pipeline-gpu.yaml -o pipelines/selfplay.yaml
    sparring run                                   # the same pipeline under kfp.local

`build_pipeline(cfg)` bakes the compile-time choices into the graph: the number of iterations,
the warm start, images, GPUs, node selectors, tolerations, the S3 Secret, /dev/shm, retries,
caching (pure steps only), each step's resources and timeout, the non-root security context,
pull secrets and the run's deadline; their fingerprint goes to `start`. At run time the KFP UI
exposes `config` (the whole PipelineConfig as JSON) and the typed run parameters of
sparring.loop.run_params; `start` resolves them into the config every later task reads.
The pipeline's outputs are the champion's version and score. Each iteration's model is the previous train step's
output; the first is `config.model` (optionally warm-started by SFT). Each rollout after the
first gets the previous one's difficulty schedule (`opponents`, sparring.loop.league); when
the pool names earlier checkpoints (`past-<k>`), rollout i also waits for register i-k-1 of the
smallest k, whose stored checkpoint it loads. With
`train_backend: verl` an iteration is verl-train → evaluate → register instead: one task on
`verl.n_gpus_per_node` GPUs plays and trains inside verl (sparring.loop.verl_task). With
`rollout.shards: N` each rollout is N shard tasks in a `ParallelFor` (one slice of the initial
states each, `kubernetes.rollout_gpus` apiece) and a merge task (sparring.loop.shards).
The IR grows by about 30 KB per iteration: for long campaigns use `pipelines.driver`, one run per block.
"""

from typing import NamedTuple

from kfp import dsl, kubernetes
from sparring.components import make_components

from sparring.loop import run_params
from sparring.loop.config import PURE_STEPS, KubernetesSettings, PipelineConfig

S3_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
MLFLOW_LOGIN = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")  # basic auth
CHECKSUM_ENV = ("AWS_REQUEST_CHECKSUM_CALCULATION", "AWS_RESPONSE_CHECKSUM_VALIDATION")
HF_HOME = "/home/sparring/.cache/huggingface"  # the runtime images' $HF_HOME


class Outputs(NamedTuple):
    """The pipeline's outputs (from the exit handler): the registered model's champion."""

    champion_version: str
    champion_score: float


def _every_task(task: dsl.PipelineTask, step: str, cfg: PipelineConfig) -> dsl.PipelineTask:
    """What every task gets: caching (pure steps only), retries, non-root security context,
    resources and timeout of its step, image pull secrets, the S3 credentials Secret (as the
    standard AWS variables), the S3 endpoint, region and checksum mode, and the optional
    HF_TOKEN Secret, MLflow login Secret and model-cache PVC."""
    k8s, res = cfg.kubernetes, cfg.kubernetes.step_resources(step)
    task.set_caching_options(k8s.caching and step in PURE_STEPS)
    if k8s.retries:
        task.set_retry(k8s.retries, backoff_duration="30s")
    kubernetes.set_security_context(
        task, run_as_user=k8s.run_as_user, run_as_group=k8s.run_as_group, run_as_non_root=True
    )
    task.set_cpu_request(res.cpu).set_cpu_limit(res.cpu_limit)
    task.set_memory_request(res.memory).set_memory_limit(res.memory_limit)
    kubernetes.empty_dir_mount(task, "scratch", "/tmp", size_limit=res.scratch)
    kubernetes.set_timeout(task, res.timeout_seconds)
    if k8s.image_pull_secrets:
        kubernetes.set_image_pull_secrets(task, k8s.image_pull_secrets)
    for name, value in _storage_env(cfg).items():
        task.set_env_variable(name, value)
    if k8s.s3_secret:
        kubernetes.use_secret_as_env(task, k8s.s3_secret, {key: key for key in S3_KEYS})
    if k8s.hf_secret:
        kubernetes.use_secret_as_env(task, k8s.hf_secret, {"HF_TOKEN": "HF_TOKEN"})
    if k8s.mlflow_secret:
        kubernetes.use_secret_as_env(task, k8s.mlflow_secret, {key: key for key in MLFLOW_LOGIN})
    if k8s.model_cache_pvc:
        kubernetes.mount_pvc(task, k8s.model_cache_pvc, HF_HOME)
    return task


def _storage_env(cfg: PipelineConfig) -> dict[str, str]:
    """The AWS variables every task gets, so that any S3 client in it (boto3 in MLflow, hub
    libraries) reaches the configured server: endpoint, region, and checksums only when
    required (boto3 >= 1.36 sends CRC32 checksums that many non-AWS servers reject)."""
    env = {"AWS_DEFAULT_REGION": cfg.storage.region}
    env |= dict.fromkeys(CHECKSUM_ENV, "when_required")
    if cfg.storage.endpoint_url:
        env["AWS_ENDPOINT_URL_S3"] = cfg.storage.endpoint_url
    return env


def _accelerated(task: dsl.PipelineTask, gpus: int, k8s: KubernetesSettings) -> dsl.PipelineTask:
    """GPU request, node selector, tolerations and a RAM-backed /dev/shm (NCCL, dataloaders)."""
    if not gpus:
        return task
    task.set_accelerator_type(k8s.accelerator_type).set_accelerator_limit(gpus)
    for key, value in k8s.node_selector.items():
        kubernetes.add_node_selector(task, key, value)
    for t in k8s.tolerations:
        kubernetes.add_toleration(
            task, key=t.key, operator=t.operator, value=t.value, effect=t.effect
        )
    if k8s.shm_size:
        kubernetes.empty_dir_mount(
            task, "dshm", "/dev/shm", medium="Memory", size_limit=k8s.shm_size
        )
    return task


def build_pipeline(cfg: PipelineConfig):
    """The self-play pipeline function for `cfg` (compile it, run it locally or submit it)."""
    cfg.grpo_config(), cfg.sft_config()  # fail now, not in a train task
    k8s = cfg.kubernetes
    c = make_components(k8s)

    def task(component, name: str, gpus: int = 0, **kwargs) -> dsl.PipelineTask:
        made = _every_task(component(**kwargs), component.name, cfg)
        return _accelerated(made, gpus, k8s).set_display_name(name)

    p = run_params.values(cfg)
    compiled = run_params.compile_time(cfg)

    def selfplay_pipeline(
        config: str = cfg.model_dump_json(),
        model: str = p["model"],
        learning_rate: float = p["learning_rate"],
        init_seed: int = p["init_seed"],
        sampling_seed: int = p["sampling_seed"],
        games_per_iteration: int = p["games_per_iteration"],
        eval_games: int = p["eval_games"],
        experiment: str = p["experiment"],
        registered_model: str = p["registered_model"],
    ) -> Outputs:
        run = {"compiled": compiled, "job_id": dsl.PIPELINE_JOB_ID_PLACEHOLDER}
        run["job_name"] = dsl.PIPELINE_JOB_NAME_PLACEHOLDER
        names = {"experiment": experiment, "registered_model": registered_model}
        finish = task(c.finish, "finish", config=config, **run, **names)
        with dsl.ExitHandler(finish, name="iterations"):  # finish runs even if a task fails
            start = task(
                c.start,
                "start",
                config=config,
                **run,
                **names,
                model=model,
                learning_rate=learning_rate,
                init_seed=init_seed,
                sampling_seed=sampling_seed,
                games_per_iteration=games_per_iteration,
                eval_games=eval_games,
            )
            run_name, parent = start.outputs["run_name"], start.outputs["parent_run_id"]
            config = start.outputs["run_config"]  # the config with the run parameters applied
            inits = task(c.game_init, "game-init", config=config, run_name=run_name).outputs[
                "inits"
            ]
            model = task(c.initial_model, "initial-model", config=config).outputs["model"]
            if cfg.warm_start:
                warm = task(
                    c.warm_start,
                    "warm-start",
                    k8s.train_gpus,
                    config=config,
                    base=model,
                    inits=inits,
                )
                model = warm.outputs["model"]
            reference, registers, schedule = model, {}, {}
            past = cfg.opponents.checkpoint_steps  # rollout i loads register i-k-1's upload
            for i in range(cfg.first_iteration, cfg.first_iteration + cfg.iterations):
                if cfg.train_backend == "verl":  # one GPU task plays and trains (route 1)
                    v = cfg.verl  # nnodes > 1: the task drives a RayJob and needs no GPU
                    tr = task(
                        c.verl_train,
                        f"verl-train-{i}",
                        v.n_gpus_per_node if v.nnodes == 1 else 0,
                        config=config,
                        model=model,
                        inits=inits,
                        iteration=i,
                        games=games_per_iteration,
                        run_name=run_name,
                    )
                    if v.nnodes > 1:  # the volume the Ray pods share (model, rows, checkpoints)
                        kubernetes.mount_pvc(tr, v.rayjob.shared_pvc, v.rayjob.shared_path)
                    samples, rollout_metrics = tr.outputs["data"], tr.outputs["metrics"]
                else:
                    play = {"config": config, "model": model, "inits": inits, "iteration": i}
                    play["games"] = games_per_iteration
                    if cfg.rollout.shards > 1:  # fan out by initial state, then merge
                        shards = list(range(cfg.rollout.shards))
                        with dsl.ParallelFor(shards, name=f"rollout-shards-{i}") as shard:
                            part = task(
                                c.rollout_shard,
                                f"rollout-{i}-shard",
                                k8s.rollout_gpus,
                                shard=shard,
                                **play,
                            )
                        ro = task(
                            c.merge_rollouts,
                            f"rollout-{i}",
                            config=config,
                            shards=dsl.Collected(part.outputs["samples"]),
                            iteration=i,
                            run_name=run_name,
                        )
                    else:
                        ro = task(
                            c.rollout,
                            f"rollout-{i}",
                            k8s.rollout_gpus,
                            run_name=run_name,
                            **play,
                            **schedule,
                        )
                        schedule = {"previous_schedule": ro.outputs["schedule"]}  # carried on
                    if past and i - past[0] - 1 in registers:
                        ro.after(registers[i - past[0] - 1])
                    tr = task(
                        c.train,
                        f"train-{i}",
                        k8s.train_gpus,
                        config=config,
                        model=model,
                        reference=reference,
                        samples=ro.outputs["samples"],
                        parent_run_id=parent,
                        iteration=i,
                    )
                    samples, rollout_metrics = ro.outputs["samples"], ro.outputs["metrics"]
                ev = task(
                    c.evaluate,
                    f"evaluate-{i}",
                    k8s.eval_gpus,
                    config=config,
                    model=tr.outputs["trained"],
                    previous=model,
                    inits=inits,
                    iteration=i,
                    run_name=run_name,
                )
                rg = task(
                    c.register,
                    f"register-{i}",
                    config=config,
                    model=tr.outputs["trained"],
                    iteration=i,
                    run_name=run_name,
                    parent_run_id=parent,
                    samples=samples,
                    evaluation=ev.outputs["evaluation"],
                    rollout_metrics=rollout_metrics,
                    train_metrics=tr.outputs["metrics"],
                    eval_metrics=ev.outputs["metrics"],
                    kfp_run_id=run["job_id"],
                )
                if i - 1 in registers:
                    rg.after(registers[i - 1])  # champion decisions in iteration order
                model, registers[i] = tr.outputs["trained"], rg
        return Outputs(finish.outputs["champion_version"], finish.outputs["champion_score"])

    selfplay_pipeline.__doc__ = _docstring()
    deadline = dsl.PipelineConfig(active_deadline_seconds=k8s.run_deadline_seconds)
    return dsl.pipeline(name=cfg.name, pipeline_config=deadline)(selfplay_pipeline)


def _docstring() -> str:
    """The pipeline's docstring: the KFP UI shows it and each parameter's description."""
    lines = [
        "Self-play GRPO: game-init, then per iteration rollout → train → evaluate → register.",
        "",
        "A run parameter left at its default keeps the config's value; a changed one sets its",
        "config field. Changing a field both ways fails in `start`, and so does a `config` that",
        "changes compile-time fields (iterations, warm start, backend, images, GPUs).",
        "",
        "Args:",
        "    config: the whole PipelineConfig as JSON (sparring.loop.config).",
    ]
    lines += [f"    {name}: {param.help}" for name, param in run_params.RUN_PARAMETERS.items()]
    return "\n".join(lines)


def compile_pipeline(cfg: PipelineConfig, out: str) -> str:
    """Compile the pipeline for `cfg` to a YAML file; returns its path."""
    from kfp import compiler

    compiler.Compiler().compile(build_pipeline(cfg), out)
    return out
