"""KFP components: thin typed wrappers over `sparring.loop.tasks` (installed as sparring.components).

Each module holds plain typed functions; `make_components(k8s)` turns them into lightweight
components on the configured images, with `install_kfp_package=False` because the image
already has kfp and Sparring. The same function body runs under `kfp.local` and in a pod.
"""

from typing import NamedTuple

from kfp import dsl

from . import evaluate, game_init, model, population, register, rollout, run, shards, train


class Components(NamedTuple):
    """The pipeline's components, bound to their images."""

    start: object
    game_init: object
    initial_model: object
    warm_start: object
    average: object
    rollout: object
    rollout_shard: object
    merge_rollouts: object
    train: object
    verl_train: object
    evaluate: object
    evaluate_test: object
    register: object
    finish: object
    population_rollout: object
    population_train: object
    population_evaluate: object
    population_register: object


def make_components(k8s) -> Components:
    """Components on `k8s.image`, or `k8s.gpu_image` for steps that request accelerators.

    Args:
        k8s: a sparring.loop.config.KubernetesSettings.
    """

    def on(func, gpus: int = 0):
        image = k8s.gpu_image if gpus else k8s.image
        return dsl.component(func, base_image=image, install_kfp_package=False)

    return Components(
        start=on(run.start),
        game_init=on(game_init.game_init),
        initial_model=on(model.initial_model),
        warm_start=on(model.warm_start, k8s.train_gpus),
        average=on(model.average, k8s.train_gpus),
        rollout=on(rollout.rollout, k8s.rollout_gpus),
        rollout_shard=on(shards.rollout_shard, k8s.rollout_gpus),
        merge_rollouts=on(shards.merge_rollouts),
        train=on(train.train, k8s.train_gpus),
        verl_train=on(train.train_verl, gpus=1),  # verl always runs on GPUs: the -gpu image
        evaluate=on(evaluate.evaluate, k8s.eval_gpus),
        evaluate_test=on(evaluate.evaluate_test, k8s.eval_gpus),
        register=on(register.register),
        finish=on(run.finish),
        population_rollout=on(population.population_rollout, k8s.rollout_gpus),
        population_train=on(population.population_train, k8s.train_gpus),
        population_evaluate=on(population.population_evaluate, k8s.eval_gpus),
        population_register=on(population.population_register),
    )
