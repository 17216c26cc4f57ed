"""Every YAML config the project ships validates against the config class it is written for."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml

from sparring.loop.config import CONFIG_DIR, Deployment, GPUMemoryWarning, PipelineConfig
from sparring.recipe import Recipe
from sparring.train_config import GRPOConfig, SFTConfig

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted(CONFIG_DIR.rglob("*.yaml"))
CLASSES = {"train.yaml": GRPOConfig, "sft.yaml": SFTConfig, "sft-average.yaml": SFTConfig}
"""The config class of each file that is not a pipeline config."""


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(CONFIG_DIR)))
def test_shipped_config_validates(path: Path):
    cls = CLASSES.get(path.name, PipelineConfig)
    data = yaml.safe_load(path.read_text())
    cls.model_validate(data)


def test_every_config_opens_with_a_comment_block():
    for path in SHIPPED:
        assert path.read_text().startswith("#"), f"{path} has no header comment"


def test_a_broken_config_names_the_bad_field():
    data = yaml.safe_load((CONFIG_DIR / "pipeline.yaml").read_text())
    data["rollout"]["games_per_init"] = 0
    with pytest.raises(ValueError, match="rollout.games_per_init"):
        PipelineConfig.model_validate(data)


def test_the_real_model_pipeline_starts_from_the_cached_conversion(
    smollm2_dir, tmp_path, monkeypatch
):
    """Its initial-model task resolves the name offline from the model cache."""
    from sparring.loop.tasks import initial_model
    from sparring.model_zoo import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, str(smollm2_dir.parents[1]))  # <cache>/named/<model>
    cfg = PipelineConfig.model_validate(
        yaml.safe_load((CONFIG_DIR / "pipeline-smollm2.yaml").read_text())
    )
    out = initial_model(cfg, tmp_path / "model")
    assert (out / "model.safetensors").stat().st_size == (
        smollm2_dir / "model.safetensors"
    ).stat().st_size
    assert not (out / ".complete").exists()  # the cache's marker stays in the cache


def test_validating_a_config_imports_no_trainer_or_tracker():
    code = (
        "import sys\n"
        "from sparring.loop.config import PipelineConfig\n"
        "PipelineConfig.from_yaml('configs/pipeline-smollm2.yaml')\n"
        "print(sorted(m for m in ('torch', 'verl', 'mlflow', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_train_sections_are_the_trainers_own_configs():
    cfg = PipelineConfig.from_yaml(CONFIG_DIR / "pipeline-smollm2.yaml")
    assert isinstance(cfg.train, GRPOConfig) and isinstance(cfg.warm_start.train, SFTConfig)
    with pytest.raises(ValueError, match="mini_batch_size"):
        PipelineConfig.model_validate({"train": {"micro_batch_size": 64, "mini_batch_size": 8}})


def test_a_section_is_built_with_the_top_level_game_and_may_not_name_another():
    cfg = PipelineConfig.model_validate({"game": {"name": "kuhn-poker"}})
    assert cfg.game_init.game == cfg.rollout.game == cfg.eval.rollout.game == cfg.game
    assert cfg.eval.opponent in cfg.game.cls.agents  # checked against the game's own agents
    with pytest.raises(ValueError, match="eval.rollout.game"):
        PipelineConfig.model_validate(
            {"game": {"name": "kuhn-poker"}, "eval": {"rollout": {"game": {"name": "matching"}}}}
        )


def test_the_config_is_a_recipe_and_a_deployment():
    cfg = PipelineConfig.from_yaml(CONFIG_DIR / "pipeline-gpu.yaml")
    assert set(PipelineConfig.model_fields) == set(Recipe.model_fields) | set(
        Deployment.model_fields
    )
    assert not set(Recipe.model_fields) & set(Deployment.model_fields)
    assert cfg.recipe.train == cfg.train and cfg.deployment.kubernetes == cfg.kubernetes
    assert PipelineConfig.model_validate_json(cfg.model_dump_json()) == cfg  # what tasks get


def test_the_published_schema_is_the_configs():
    published = json.loads((ROOT / "docs/config.schema.json").read_text())
    assert published == PipelineConfig.model_json_schema(), (
        "docs/config.schema.json is stale: sparring schema > docs/config.schema.json"
    )
    described = PipelineConfig.model_json_schema()["properties"]
    assert all(p.get("description") for p in described.values())  # the KFP UI shows them


def test_a_gpu_config_that_would_not_fit_its_card_warns_on_validation():
    data = yaml.safe_load((CONFIG_DIR / "pipeline-gpu.yaml").read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("error", GPUMemoryWarning)
        PipelineConfig.model_validate(data)  # as shipped: it fits
    with pytest.warns(GPUMemoryWarning, match="Qwen2.5-7B-Instruct needs ~.* GB"):
        PipelineConfig.model_validate({**data, "model": "Qwen/Qwen2.5-7B-Instruct"})


@pytest.mark.parametrize(
    ("game", "key"), [("matching", "init"), ("kuhn-poker", "init_seat"), ("diplomacy", "init_seat")]
)
def test_a_recipe_groups_by_its_games_default_unless_it_sets_a_key(game, key):
    assert PipelineConfig.model_validate({"game": {"name": game}}).train.group_key == key
    chosen = PipelineConfig.model_validate({"game": {"name": game}, "train": {"group_key": "role"}})
    assert chosen.train.group_key == "role"


def test_init_country_is_diplomacys_word_for_init_seat():
    data = {"game": {"name": "diplomacy"}, "train": {"group_key": "init_country"}}
    assert PipelineConfig.model_validate(data).train.group_key == "init_seat"


def test_a_recipe_fixes_dr_grpos_divisor_for_the_whole_run():
    cfg = PipelineConfig.model_validate({"rollout": {"max_context_tokens": 2048}})
    assert cfg.train.loss_scale_factor == 2048  # the longest row the rollout can produce
    capped = PipelineConfig.model_validate({"train": {"max_seq_len": 1024}})
    assert capped.train.loss_scale_factor == 1024


def test_no_two_shipped_recipes_compete_for_one_champion():
    """Each shipped pipeline config registers its own model: their scores are not comparable."""
    names = {}
    for path in SHIPPED:
        if path.name not in CLASSES and "examples" not in path.parts:
            cfg = PipelineConfig.from_yaml(path)
            assert cfg.registered_model not in names, (path.name, names.get(cfg.registered_model))
            names[cfg.registered_model] = path.name


def test_a_recipe_without_a_registered_model_gets_one_per_evaluation():
    """The default name carries the eval key: another training shares the champion, another
    evaluation (game, val states, eval settings or champion metric) does not."""
    base = PipelineConfig.model_validate({})
    assert base.registered_model == f"sparring-matching-{base.eval_key}"
    retrained = PipelineConfig.model_validate({"train": {"lr": 1e-5}, "iterations": 9})
    assert retrained.registered_model == base.registered_model
    for other in (
        {"game": {"params": {"k": 4}}},
        {"game_init": {"num_val": 8}},
        {"game_init": {"seed": 1}},
        {"eval": {"modes": ["selfplay"]}},
        {"champion_metric": "eval/vs_scripted/all/normalized_reward"},
    ):
        assert PipelineConfig.model_validate(other).registered_model != base.registered_model


def test_a_champion_metric_of_a_mode_not_played_is_refused():
    """It would fail in the first register, after an update, not when the run is submitted."""
    cfg = {"eval": {"modes": ["selfplay"]}, "champion_metric": "eval/vs_scripted/all/win_rate"}
    with pytest.raises(ValueError, match="eval mode 'vs_scripted', which eval.modes"):
        PipelineConfig.model_validate(cfg)
    PipelineConfig.model_validate(cfg | {"champion_metric": "eval/selfplay/all/win_rate"})


@pytest.mark.parametrize(
    "section",
    [
        {"rollout": {"sampling": {"temprature": 0.7}}},
        {"rollout": {"backend": {"nmae": "hf"}}},
        {"game_init": {"num_tain": 8}},
        {"eval": {"rollout": {"game_params": {"k": 3}}}},
        {"tracking": {"experimnet": "x"}},
    ],
)
def test_a_misspelt_key_anywhere_fails_instead_of_being_ignored(section):
    with pytest.raises(ValueError, match="Extra inputs are not permitted"):
        PipelineConfig.model_validate(section)


def test_the_average_distills_with_the_shipped_sft_average_settings():
    """`average: {}` trains as configs/sft-average.yaml says (the settings of the measured
    Kuhn Poker distillation), so the file and the default can't drift apart."""
    from sparring.recipe import Average

    shipped = SFTConfig.model_validate(
        yaml.safe_load((CONFIG_DIR / "sft-average.yaml").read_text())
    )
    assert Average().train == shipped


def test_an_average_given_in_part_keeps_the_other_distilling_settings():
    """`average: {train: {steps: 2}}` changes the steps only: the rest stays the distilling
    default (at the sampling temperature, duplicates merged), not SFTConfig's plain one."""
    from sparring.loop.replicates import seeded

    cfg = PipelineConfig.model_validate({"average": {"train": {"steps": 2}}})
    assert cfg.average.train.steps == 2
    assert cfg.average.train.at_sampling_temperature and cfg.average.train.merge_duplicates
    assert cfg.average.train.lr == 5e-4
    again = seeded(cfg, 3).average.train  # a training seed keeps them too
    assert (again.seed, again.steps, again.lr, again.merge_duplicates) == (3, 2, 5e-4, True)
