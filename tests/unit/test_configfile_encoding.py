"""A UTF-16 `--configfile`. `wattflex doctor --configfile` says so in one line
(exit 2). Plain `snakemake --configfile` cannot be made to: Snakemake's CLI loads the file
(``snakemake.cli.args_to_api`` -> ``ConfigSettings.__post_init__`` -> ``load_configfile``)
before any Snakefile code runs, and its loader opens the file as UTF-8 and catches only
``ValueError`` from JSON and ``yaml.YAMLError`` from YAML, so the ``UnicodeDecodeError`` of
the second read escapes as a traceback. The second test pins that, so that a Snakemake that
starts to say it cleanly is noticed (and the README's caveat dropped)."""

from pathlib import Path

import pytest

from wattflex import cli

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def utf16_config(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_bytes((REPO / "config" / "config.yaml").read_text().encode("utf-16"))
    return path


def test_doctor_names_the_encoding_in_one_line(utf16_config, capsys):
    code = cli.main(["doctor", "--configfile", str(utf16_config)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert f"{utf16_config}: not UTF-8 text: UTF-16" in err and "save it as UTF-8" in err


def test_snakemakes_own_loader_still_lets_the_decode_error_escape(utf16_config):
    from snakemake.common.configfile import load_configfile

    with pytest.raises(UnicodeDecodeError):
        load_configfile(str(utf16_config))
