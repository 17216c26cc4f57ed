"""The iterative self-play pipeline: game-init once, then per iteration
rollout → train → evaluate → register, unrolled at compile time (KFP v2 has no recursion).

    sparring compile --config configs/pipeline-gpu.yaml -o pipelines/selfplay.yaml
    sparring run                                   # the same pipeline under kfp.local

`build_pipeline(cfg)` bakes the compile-time choices into the graph: the number of iterations,
the warm start, images, GPUs, node selectors, tolerations, the S3 Secret, /dev/shm, retries,
caching (pure steps only), each step's resources and timeout, the non-root security context,
pull secrets and, for KFP 2.17 (`kubernetes.kfp_version`), the run's deadline; their
fingerprint goes to `start`. At run time the KFP UI exposes `config` (the whole PipelineConfig
as JSON) and the typed run parameters of sparring.loop.run_params; `start` resolves them into the config every later task reads.
With `evaluate_start` the start is evaluated on val before any update; with
`game_init.num_test` the start and the final model are scored once on the test states at the
end (evaluate-test). The pipeline's outputs are the champion's version and score. Each iteration's model is the previous train step's
output; the first is `config.model` (optionally warm-started by SFT). Each rollout after the
first gets the previous one's difficulty schedule (`opponents`, sparring.loop.league); when
the pool names earlier checkpoints (`past-<k>`), rollout i also waits for register i-k-1 of the
smallest k, whose stored checkpoint it loads. With
`train_backend: verl` an iteration is verl-train → evaluate → register instead: one task on
`verl.n_gpus_per_node` GPUs plays and trains inside verl (sparring.loop.verl_task). With
`rollout.shards: N` each rollout is N shard tasks in a `ParallelFor` (one slice of the initial
states each, `kubernetes.rollout_gpus` apiece) and a merge task (sparring.loop.shards). With
`population: {size: K}` an iteration is one rollout that seats and rates the K members, a
`ParallelFor` over the members (train → evaluate each) and one register task for all, the
best rated first (sparring.loop.population); each rollout gets the previous one's population
state and trained members, and the lead's checkpoint is the iteration's model. With
`average`, after the last iteration an average task distills the iterates into one model
(sparring.loop.tasks.average), evaluate-average and register-average score and register it
(alias `average`), and evaluate-test scores it as the final model.
Every iteration grows the IR and the Argo Workflow made of it (docs/results.md#compiled-ir-size):
`sparring.pipelines.workflow_size` caps iterations per run, `pipelines.driver` runs campaigns.
"""

from typing import NamedTuple

from kfp import dsl, kubernetes
from sparring.components import make_components

from sparring.loop import run_params
from sparring.loop.config import (
    PURE_STEPS,
    RETRY_BACKOFF_FACTOR,
    RETRY_BACKOFF_SECONDS,
    KubernetesSettings,
    PipelineConfig,
    field_lines,
)
from sparring.loop.plan import IterationPlan, plan
from sparring.registry import TRAINER_IMAGE_ENV

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
        task.set_retry(
            k8s.retries,
            backoff_duration=f"{RETRY_BACKOFF_SECONDS}s",
            backoff_factor=RETRY_BACKOFF_FACTOR,
            backoff_max_duration=f"{k8s.retry_max_duration(step)}s",
        )
    kubernetes.set_security_context(  # a None uid/gid is left out: the cluster assigns it
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


class _Graph:
    """Builds one run's tasks: every task gets `_every_task` and, when it requests
    accelerators, `_accelerated`. The per-variant builders below each add one stage."""

    def __init__(self, cfg: PipelineConfig, config, job_id) -> None:
        self.cfg, self.c, self.config, self.job_id = (
            cfg,
            make_components(cfg.kubernetes),
            config,
            job_id,
        )
        self.run_name = self.parent = self.inits = None  # `start`'s and game-init's outputs
        self.games = None  # the run parameter games_per_iteration (the plan's is compile-time)

    def task(
        self, component, name: str, gpus: int = 0, step: str | None = None, **kwargs
    ) -> dsl.PipelineTask:
        """A task of `component`, with the settings of `step` (default: the component's name;
        a population's components take those of the single learner's steps)."""
        made = _every_task(component(**kwargs), step or component.name, self.cfg)
        return _accelerated(made, gpus, self.cfg.kubernetes).set_display_name(name)

    def rollout(self, step: IterationPlan, model, schedule: dict) -> dsl.PipelineTask:
        """One rollout task (pure self-play or the opponent mix, schedule carried on)."""
        return self.task(
            self.c.rollout, f"rollout-{step.iteration}", self.cfg.kubernetes.rollout_gpus,
            **self._play(step, model), run_name=self.run_name, **schedule,
        )  # fmt: skip

    def sharded_rollout(self, step: IterationPlan, model) -> dsl.PipelineTask:
        """`rollout.shards` shard tasks in a ParallelFor (a slice of the states each), merged."""
        i, k8s = step.iteration, self.cfg.kubernetes
        with dsl.ParallelFor(
            list(range(self.cfg.rollout.shards)), name=f"rollout-shards-{i}"
        ) as shard:
            part = self.task(
                self.c.rollout_shard, f"rollout-{i}-shard", k8s.rollout_gpus, shard=shard,
                **self._play(step, model),
            )  # fmt: skip
        return self.task(
            self.c.merge_rollouts, f"rollout-{i}", config=self.config,
            shards=dsl.Collected(part.outputs["samples"]), iteration=i, run_name=self.run_name,
        )  # fmt: skip

    def train(self, step: IterationPlan, model, reference, samples, optimizer=None):
        """The GRPO update on a rollout's samples (continuing `optimizer`, the previous
        update's AdamW state, with `train.optimizer_state: carry`)."""
        extra = {"previous_optimizer": optimizer} if optimizer is not None else {}
        return self.task(
            self.c.train, f"train-{step.iteration}", self.cfg.kubernetes.train_gpus,
            config=self.config, model=model, reference=reference, samples=samples,
            parent_run_id=self.parent, iteration=step.iteration, run_name=self.run_name,
            **extra,
        )  # fmt: skip

    def verl(self, step: IterationPlan, model) -> dsl.PipelineTask:
        """`train_backend: verl`: one task plays and trains (with nnodes > 1 it drives a RayJob
        and needs no GPU of its own, only the volume the Ray pods share)."""
        v = self.cfg.verl
        tr = self.task(
            self.c.verl_train, f"verl-train-{step.iteration}",
            v.n_gpus_per_node if v.nnodes == 1 else 0, **self._play(step, model),
            run_name=self.run_name,
        )  # fmt: skip
        if v.nnodes > 1:
            kubernetes.mount_pvc(tr, v.rayjob.shared_pvc, v.rayjob.shared_path)
        return tr

    def evaluate(self, iteration: int, model, previous=None) -> dsl.PipelineTask:
        """Val games with `model` (against `previous` where a mode needs it); without
        `previous` (the start's) recorded in the parent run, which no register step does."""
        extra = {"previous": previous} if previous is not None else {"parent_run_id": self.parent}
        return self.task(
            self.c.evaluate, f"evaluate-{iteration}", self.cfg.kubernetes.eval_gpus,
            config=self.config, model=model, inits=self.inits, iteration=iteration,
            run_name=self.run_name, **extra,
        )  # fmt: skip

    def register(self, step: IterationPlan, trained, samples, rollout_metrics, tr, ev):
        """Store and register the iteration's checkpoint, with all its metrics; the model's
        requirements are those of the image that trained it ($SPARRING_TRAINER_IMAGE)."""
        return self.task(
            self.c.register, f"register-{step.iteration}", config=self.config, model=trained,
            iteration=step.iteration, run_name=self.run_name, parent_run_id=self.parent,
            samples=samples, evaluation=ev.outputs["evaluation"],
            rollout_metrics=rollout_metrics, train_metrics=tr.outputs["metrics"],
            eval_metrics=ev.outputs["metrics"], kfp_run_id=self.job_id,
        ).set_env_variable(TRAINER_IMAGE_ENV, self._trainer_image())  # fmt: skip

    def average(self, step: IterationPlan, last, last_register):
        """The iterates distilled into one model after the last iteration, evaluated against
        the last iterate and registered as the iteration's `average` (after its own register,
        so that the champion is decided in order). With `source: tables` it starts after that
        register too, once every evaluation it reads is stored. Returns the distilled
        checkpoint."""
        i, k8s, name = step.iteration, self.cfg.kubernetes, "average"
        av = self.task(
            self.c.average, name, k8s.train_gpus, "train", config=self.config, last=last,
            run_name=self.run_name,
        )  # fmt: skip
        if self.cfg.average.source == "tables":  # register-i follows evaluate-i and register-(i-1)
            av.after(last_register)
        ev = self.task(
            self.c.evaluate, f"evaluate-{name}", k8s.eval_gpus, config=self.config,
            model=av.outputs["model"], previous=last, inits=self.inits, iteration=i,
            run_name=self.run_name, member=name,
        )  # fmt: skip
        self.task(
            self.c.register, f"register-{name}", config=self.config, model=av.outputs["model"],
            iteration=i, run_name=self.run_name, parent_run_id=self.parent,
            evaluation=ev.outputs["evaluation"], eval_metrics=ev.outputs["metrics"],
            train_metrics=av.outputs["metrics"], kfp_run_id=self.job_id, member=name,
        ).set_env_variable(TRAINER_IMAGE_ENV, self._trainer_image()).after(last_register)  # fmt: skip
        return av.outputs["model"]

    def population(self, step: IterationPlan, reference, carried: dict):
        """A population's iteration (sparring.loop.population): the rollout seats and rates
        the members; per member (a ParallelFor over the names: K is known at compile time)
        its update and evaluation; then one register task for all, since the order (the
        best rated first, as the in-process loop registers) is known only at run time.
        `carried` is the previous iteration's members and population state ({} in the first).
        Returns (the register task, the next iteration's `carried`)."""
        i, k8s, c = step.iteration, self.cfg.kubernetes, self.c
        ro = self.task(
            c.population_rollout, f"rollout-{i}", k8s.rollout_gpus, "rollout",
            **self._play(step, reference), run_name=self.run_name, **carried,
        )  # fmt: skip
        samples, starts = ro.outputs["samples"], ro.outputs["starts"]
        at = {"config": self.config, "iteration": i, "run_name": self.run_name}
        with dsl.ParallelFor(self.cfg.population.members, name=f"members-{i}") as member:
            tr = self.task(
                c.population_train, f"train-{i}-member", k8s.train_gpus, "train", member=member,
                starts=starts, reference=reference, samples=samples, **at,
            )  # fmt: skip
            ev = self.task(
                c.population_evaluate, f"evaluate-{i}-member", k8s.eval_gpus, "evaluate",
                member=member, model=tr.outputs["trained"], starts=starts, inits=self.inits,
                **at,
            )  # fmt: skip
        rg = self.task(  # a Collected per consumer: the compiler fails on one consumed twice
            c.population_register, f"register-{i}", step="register", samples=samples,
            state=ro.outputs["state"], rollout_metrics=ro.outputs["metrics"],
            models=dsl.Collected(tr.outputs["trained"]),
            train_metrics=dsl.Collected(tr.outputs["metrics"]),
            evaluations=dsl.Collected(ev.outputs["evaluation"]),
            eval_metrics=dsl.Collected(ev.outputs["metrics"]), parent_run_id=self.parent,
            kfp_run_id=self.job_id, **at,
        ).set_env_variable(TRAINER_IMAGE_ENV, self._trainer_image())  # fmt: skip
        members = dsl.Collected(tr.outputs["trained"])
        return rg, {"members": members, "previous_state": ro.outputs["state"]}

    def _trainer_image(self) -> str:
        """The image that trains the models: what a registered model's requirements name."""
        k8s = self.cfg.kubernetes
        return k8s.gpu_image if self.cfg.train_backend == "verl" or k8s.train_gpus else k8s.image

    def _play(self, step: IterationPlan, model) -> dict:
        return {"config": self.config, "model": model, "inits": self.inits,
                "iteration": step.iteration, "games": self.games}  # fmt: skip


def build_pipeline(cfg: PipelineConfig):
    """The self-play pipeline function for `cfg` (compile it, run it locally or submit it):
    the iterations of `sparring.loop.runner.plan(cfg)`, unrolled, each stage one task."""
    if cfg.sft_control:
        raise ValueError("sft_control is a bench's control arm: run it in-process (run_loop)")
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
        g = _Graph(cfg, config, run["job_id"])
        g.games = games_per_iteration
        finish = g.task(g.c.finish, "finish", config=config, **run, **names)
        with dsl.ExitHandler(finish, name="iterations"):  # finish runs even if a task fails
            start = g.task(
                g.c.start, "start", config=config, **run, **names, model=model,
                learning_rate=learning_rate, init_seed=init_seed, sampling_seed=sampling_seed,
                games_per_iteration=games_per_iteration, eval_games=eval_games,
            )  # fmt: skip
            _iterations(g, start)
        return Outputs(finish.outputs["champion_version"], finish.outputs["champion_score"])

    selfplay_pipeline.__doc__ = _docstring()
    return dsl.pipeline(name=cfg.name, pipeline_config=_pipeline_config(cfg.kubernetes))(
        selfplay_pipeline
    )


def _pipeline_config(k8s: KubernetesSettings) -> dsl.PipelineConfig | None:
    """The run's deadline on KFP 2.17; none for 2.16, whose API server drops the whole
    Kubernetes config (Secrets, GPUs, timeouts) when the platform spec holds a field it lacks."""
    if k8s.kfp_version == "2.16":
        return None
    return dsl.PipelineConfig(active_deadline_seconds=k8s.run_deadline_seconds)


def _iterations(g: _Graph, start: dsl.PipelineTask) -> None:
    """game-init, the initial model (warm-started), its evaluation, then every planned
    iteration: as `sparring.loop.runner.run_loop` does in one process."""
    cfg = g.cfg
    g.config = config = start.outputs["run_config"]  # the config with the run parameters applied
    g.run_name = run_name = start.outputs["run_name"]
    g.parent = start.outputs["parent_run_id"]
    g.inits = g.task(g.c.game_init, "game-init", config=config, run_name=run_name).outputs["inits"]
    model = g.task(g.c.initial_model, "initial-model", config=config).outputs["model"]
    if cfg.warm_start:
        warm = g.task(
            g.c.warm_start, "warm-start", cfg.kubernetes.train_gpus, config=config, base=model,
            inits=g.inits,
        )  # fmt: skip
        model = warm.outputs["model"]
    if cfg.evaluate_start:
        g.evaluate(cfg.first_iteration - 1, model)
    start_model = magnet = model  # the KL anchor: the start, or with magnet_every the newest
    registers, schedule, optimizer = {}, {}, None
    step, carried = None, {}  # carried: a population's members and state
    for step in plan(cfg):
        if cfg.population:  # K members: the lead's checkpoint is the iteration's model
            rg, carried = g.population(step, magnet, carried)
            if step.iteration - 1 in registers:
                rg.after(registers[step.iteration - 1])  # champion decisions in iteration order
            model, registers[step.iteration] = rg.outputs["lead"], rg
            continue
        if cfg.train_backend == "verl":
            tr = g.verl(step, model)
            samples, rollout_metrics = tr.outputs["data"], tr.outputs["metrics"]
        else:
            if cfg.rollout.shards > 1:
                ro = g.sharded_rollout(step, model)
            else:
                ro = g.rollout(step, model, schedule)
                schedule = {"previous_schedule": ro.outputs["schedule"]}  # carried on
            if step.after_register is not None:  # a past-<k> opponent: its checkpoint first
                ro.after(registers[step.after_register])
            samples, rollout_metrics = ro.outputs["samples"], ro.outputs["metrics"]
            tr = g.train(step, model, magnet, samples, optimizer)
            if cfg.train.optimizer_state == "carry":
                optimizer = tr.outputs["optimizer"]
        trained = tr.outputs["trained"]
        ev = g.evaluate(step.iteration, trained, previous=model)
        rg = g.register(step, trained, samples, rollout_metrics, tr, ev)
        if step.iteration - 1 in registers:
            rg.after(registers[step.iteration - 1])  # champion decisions in iteration order
        model, registers[step.iteration] = trained, rg
        if step.moves_magnet:
            magnet = trained
    if cfg.average:  # the iterates as one model: the final model from here on
        model = g.average(step, model, registers[step.iteration])
    if cfg.game_init.num_test:  # the claim: start and final model once on the test states
        g.task(
            g.c.evaluate_test, "evaluate-test", cfg.kubernetes.eval_gpus, config=config,
            start=start_model, final=model, inits=g.inits, run_name=run_name,
            parent_run_id=g.parent, iteration=step.iteration,
        )  # fmt: skip


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
        "    config: the whole config as JSON (sparring.loop.config.PipelineConfig; its JSON",
        "        schema: `sparring schema`, docs/config.schema.json). Top-level fields:",
        *[f"        - {line}" for line in field_lines(PipelineConfig)],
    ]
    lines += [f"    {name}: {param.help}" for name, param in run_params.RUN_PARAMETERS.items()]
    return "\n".join(lines)


def compile_pipeline(cfg: PipelineConfig, out: str) -> str:
    """Compile the pipeline for `cfg` to a YAML file; returns its path."""
    from kfp import compiler

    compiler.Compiler().compile(build_pipeline(cfg), out)
    return out
