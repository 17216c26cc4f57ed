"""KFP components: a population's iteration (see sparring.loop.population), the rollout that
seats and rates every member, each member's update and evaluation, and the register of all."""

from kfp.dsl import HTML, Artifact, Dataset, Input, Metrics, Model, Output


def population_rollout(
    config: str,
    model: Input[Model],
    inits: Input[Dataset],
    iteration: int,
    games: int,
    run_name: str,
    samples: Output[Dataset],
    metrics: Output[Metrics],
    state: Output[Artifact],
    starts: Output[Artifact],
    members: Input[list[Model]] = None,
    previous_state: Input[Artifact] = None,
):
    """Play `games` games with the population seated, rate the members (step 1).

    Args:
        config: the PipelineConfig as JSON (its `population`).
        model: the start model, every member's checkpoint in the run's first iteration.
        inits: game-init folder; its train states are played.
        iteration: the round; picks the states, the seats and the sampling seed.
        games: games to play.
        run_name: from `start`; the upload goes to <storage.root>/<run_name>/<iteration>/rollout.
        samples: folder with games.jsonl, samples.parquet, stats.json, seat_plan.jsonl and
            population.json.
        metrics: rollout/*, perf/* and population/* statistics.
        state: the population after this rollout (population.json); the next `previous_state`.
        starts: one folder per member (its name) with the checkpoint it played and trains from.
        members: the previous iteration's trained members, in member order; none in the run's
            first iteration (every member is `model`, or a resumed campaign's stored members).
        previous_state: the previous rollout's `state`; none in the run's first iteration.
    """
    import shutil
    import tempfile
    from pathlib import Path

    from sparring.loop import population
    from sparring.loop.config import PipelineConfig

    cfg = PipelineConfig.model_validate_json(config).for_step("rollout")
    previous = previous_state.path if previous_state else None
    with tempfile.TemporaryDirectory(prefix="sparring-members-") as tmp:
        if members:
            given = dict(zip(cfg.population.members, [m.path for m in members], strict=True))
        else:
            given = population.start_members(
                cfg, run_name, iteration, model.path, tmp, download=False
            )
        stats, begun = population.rollout(
            cfg, given, f"{inits.path}/train.parquet", iteration, games, samples.path, run_name,
            previous,
        )  # fmt: skip
        for m, checkpoint in begun.items():  # a reference each (sparring.loop.checkpoints)
            shutil.copytree(checkpoint, Path(starts.path) / m)
    shutil.copyfile(Path(samples.path) / population.STATE_FILE, state.path)
    for name, value in stats.items():
        metrics.log_metric(name, value)


def population_train(
    config: str,
    member: str,
    starts: Input[Artifact],
    reference: Input[Model],
    samples: Input[Dataset],
    iteration: int,
    run_name: str,
    trained: Output[Model],
    metrics: Output[Metrics],
):
    """One member's GRPO update on the rows it played (step 2).

    Args:
        config: the PipelineConfig as JSON (its `train` section).
        member: the member's name (`member-<k>`).
        starts: the rollout's `starts`; the member's folder is the checkpoint it trains from.
        reference: the reference policy for the KL term (the first checkpoint).
        samples: the rollout folder (samples.parquet).
        iteration: the round.
        run_name: from `start`; the checkpoint goes to
            <storage.root>/<run_name>/<iteration>/members/<member>/checkpoint.
        trained: the member's new checkpoint.
        metrics: the member's train/* and perf/* statistics.
    """
    from sparring.loop import checkpoints, population
    from sparring.loop.config import PipelineConfig

    cfg = PipelineConfig.model_validate_json(config).for_step("train")
    kl = reference.path if cfg.train.kl_coef else None
    uri = population.member_uri(cfg, run_name, iteration, member)
    with checkpoints.local(f"{starts.path}/{member}", cfg) as m, checkpoints.local(kl, cfg) as ref:
        with checkpoints.produce(cfg, uri, trained.path) as out:
            stats = population.train_member(
                cfg, member, m, f"{samples.path}/samples.parquet", out, ref, iteration
            )
    for name, value in stats.items():
        metrics.log_metric(name, value)


def population_evaluate(
    config: str,
    member: str,
    model: Input[Model],
    starts: Input[Artifact],
    inits: Input[Dataset],
    iteration: int,
    run_name: str,
    evaluation: Output[Artifact],
    metrics: Output[Metrics],
    report: Output[HTML],
):
    """One member's val games, against its own start where a mode needs it (step 3).

    Args:
        config: the PipelineConfig as JSON (its `eval` section).
        member: the member's name (`member-<k>`).
        model: the member's trained checkpoint.
        starts: the rollout's `starts`; the member's folder is its checkpoint before training.
        inits: game-init folder; its val states are played.
        iteration: the round.
        run_name: from `start`; the upload goes to <storage.root>/<run_name>/<iteration>/eval/<member>.
        evaluation: folder with metrics.json, scores.json, rewards.png and transcripts.json.
        metrics: the member's eval/<mode>/<role>/* metrics.
        report: the reward plot and sample transcripts, viewable in the KFP UI.
    """
    from sparring.loop import checkpoints, tasks
    from sparring.loop.config import PipelineConfig

    cfg = PipelineConfig.model_validate_json(config).for_step("evaluate")
    before = f"{starts.path}/{member}"
    with checkpoints.local(model.path, cfg) as m, checkpoints.local(before, cfg) as p:
        scores, page = tasks.evaluate(
            cfg, m, p, f"{inits.path}/val.parquet", evaluation.path, run_name, iteration,
            member=member,
        )  # fmt: skip
    for name, value in scores.items():
        metrics.log_metric(name, value)
    with open(report.path, "w") as f:
        f.write(page)


def population_register(
    config: str,
    iteration: int,
    run_name: str,
    parent_run_id: str,
    samples: Input[Dataset],
    state: Input[Artifact],
    rollout_metrics: Input[Metrics],
    models: Input[list[Model]],
    train_metrics: Input[list[Metrics]],
    evaluations: Input[list[Artifact]],
    eval_metrics: Input[list[Metrics]],
    kfp_run_id: str,
    lead: Output[Model],
) -> str:
    """Register every member, the best rated (the lead) first with the iteration's metrics,
    then the others, each under its own alias (step 4).

    Args:
        config: the PipelineConfig as JSON.
        iteration: the round.
        run_name: from `start`.
        parent_run_id: the MLflow parent run, from `start`.
        samples: the rollout folder (games.jsonl is logged to MLflow with the lead).
        state: the rollout's population state; its ratings rank the members.
        rollout_metrics: the rollout's metrics.
        models, train_metrics, evaluations, eval_metrics: each member's trained checkpoint,
            train/*, evaluate folder and eval/*, in member order.
        kfp_run_id: the KFP run's unique id, a tag of each model version.
        lead: the lead's checkpoint (a copy of its reference): the iteration's model.

    Returns:
        The lead's new model version.
    """
    import shutil

    from sparring.loop import population, tasks
    from sparring.loop.config import PipelineConfig
    from sparring.tracking import numeric

    cfg = PipelineConfig.model_validate_json(config)
    names = cfg.population.members
    trained = dict(zip(names, [m.path for m in models], strict=True))
    own = {m: numeric(t.metadata) for m, t in zip(names, train_metrics, strict=True)}
    evals = {m: numeric(e.metadata) for m, e in zip(names, eval_metrics, strict=True)}
    folders = dict(zip(names, [e.path for e in evaluations], strict=True))
    ranked = population.ranking(state.path)
    metrics = population.iteration_metrics(numeric(rollout_metrics.metadata), own, evals, ranked[0])
    scores = {m: tasks.load_scores(folder) for m, folder in folders.items()}
    artifacts = [f"{samples.path}/games.jsonl", folders[ranked[0]]]
    done = population.register(
        cfg, parent_run_id, run_name, iteration, trained, metrics, evals, scores, ranked,
        artifacts, kfp_run_id or None,
    )  # fmt: skip
    shutil.copytree(trained[ranked[0]], lead.path, dirs_exist_ok=True)
    return done[ranked[0]].version
