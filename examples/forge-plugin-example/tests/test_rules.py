"""The rule ``example.window-covers-row`` fires exactly when the window cannot matter."""


def test_window_rule_fires_only_when_the_window_covers_the_row(forge_conformance):
    window = {"attention": {"backend": "window", "options": {"window": 64}}, "data": {"seq_len": 64}}
    messages = forge_conformance.check_rule(
        "example.window-covers-row",
        violating=[window, (window, ["attention.options.window=1000"])],
        passing=[
            (window, ["attention.options.window=63"]),
            {"data": {"seq_len": 64}},  # another backend: not our business
        ],
    )
    assert "window = 64 is not below data.seq_len = 64" in messages[0]
