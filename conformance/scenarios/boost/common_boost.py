"""Boost level tables and boost_config_dict handling, framework-neutral.

K: make(level, cfg) -> a fresh AutoBoost (MindSpore: the singleton reset first),
make_default() -> AutoBoost() with no arguments, flags(ab) -> dict, settings(ab) -> dict of
section settings by MindSpore name, exc_name.
"""

CASES = {
    "O0.default": ("O0", ""),
    "O1.default": ("O1", ""),
    "O2.default": ("O2", ""),
    "O1.empty_dict": ("O1", {}),
    "O1.auto_with_section": (
        "O1",
        {
            "boost": {"mode": "auto"},
            "grad_freeze": {"freeze_p": 0.5, "param_groups": 4},
            "less_bn": {"fn_flag": False},
        },
    ),
    "O0.section_of_off_feature": ("O0", {"grad_freeze": {"param_groups": 3}}),
    "O0.common_always": ("O0", {"common": {"device_number": 4}}),
    "O1.manual": (
        "O1",
        {"boost": {"mode": "manual", "less_bn": False, "grad_freeze": True, "adasum": True}},
    ),
    "O2.disable_all": ("O2", {"boost": {"mode": "disable_all"}}),
    "O0.enable_all": ("O0", {"boost": {"mode": "enable_all"}}),
    "O0.enable_all_dim_reduce": (
        "O0",
        {"boost": {"mode": "enable_all"}, "dim_reduce": {"rho": 0.6}},
    ),
    "O1.grad_accumulation_manual": (
        "O1",
        {
            "boost": {"mode": "manual", "grad_accumulation": True},
            "grad_accumulation": {"grad_accumulation_step": 4},
        },
    ),
}


def scenario(K):
    out = {}
    for key, (level, cfg) in CASES.items():
        try:
            ab = K.make(level, cfg)
            fl = K.flags(ab)
            out[f"{key}.flags"] = fl
            # a section only matters when its feature is on (or it is 'common')
            out[f"{key}.settings"] = {
                k: v
                for k, v in K.settings(ab).items()
                if k.split(".")[0] == "common" or fl.get(k.split(".")[0])
            }
        except Exception as e:  # noqa: BLE001
            out[f"{key}.flags"] = f"raises {type(e).__name__}"
            out[f"{key}.settings"] = f"raises {type(e).__name__}"
    out["mode_unknown"] = K.exc_name(lambda: K.make("O1", {"boost": {"mode": "foo"}}))
    out["level_O3"] = K.guard(lambda: K.flags(K.make("O3", "")))
    out["default_level_flags"] = K.guard(lambda: K.flags(K.make_default()))
    out["second_instance_keeps_first_level"] = K.guard(lambda: K.second_instance())
    out["manual_mutates_level_table"] = K.guard(lambda: K.manual_mutates_table())
    return out
