"""Every resolved config (9 objectives x CPU/GPU x 9 flag sets) as JSON: run it on two checkouts and compare.
Usage: python tests/tools/resolved_configs.py OLD_DIR > old.json; python tests/tools/resolved_configs.py . > new.json"""
import sys, json, itertools
sys.path.insert(0, sys.argv[1])
import transparent_grpo as tg
from dataclasses import asdict
out = {}
extras = [{}, dict(clip_eps=0.1), dict(advantage="mean"), dict(group_size=8, prompts_per_step=2), dict(beta=0.0),
          dict(kl_placement="loss"), dict(model="some/other"), dict(preset="qwen2.5-3b"), dict(preset="smollm2-135m")]
for o, cuda, i in itertools.product(sorted(tg.OBJECTIVES), [False, True], range(len(extras))):
    out[f"{o}-{cuda}-{i}"] = asdict(tg.resolve(tg.Config(objective=o, **extras[i]), cuda=cuda))
print(json.dumps(out, sort_keys=True))
