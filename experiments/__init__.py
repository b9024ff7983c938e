"""Runnable experiments: one package or module per table or figure of the
paper, built on a shared toolkit.

- `options`, `option_types`, `groups`: each option declared once (the
  command line, config files, `config.json`, help and validation come from
  the declaration);
- `registry`: every algorithm by name, with per-algorithm settings;
- `cli`: parse, resolve, load, then write `config.json` and run;
- `training`, `tracking`, `plots`, `files`, `report`: runs, progress and
  TensorBoard, figures, atomic files, README tables from results files.
"""
