"""Template variables shared by the specctl dashboards: data source, model, engine, category."""

from __future__ import annotations

from dashboards import metrics as m
from dashboards.panels import JSON, datasource_variable, query_variable


def variables() -> list[JSON]:
    """``$datasource``, ``$model_name``, ``$engine`` and ``$category``, each multi-value with ``All``.

    ``engine`` lists specctl engine ids (``SPECCTL_ENGINE_ID``), taken from the controller's ingest counter
    so that an engine shows up as soon as it posts anything, even a rejected batch.
    """
    return [
        datasource_variable(),
        query_variable("model_name", "Model", m.REQUEST_STEPS),
        query_variable("engine", "Engine", m.TELEMETRY_BATCHES),
        query_variable("category", "Category", m.REQUEST_STEPS, 'model_name=~"$model_name"'),
    ]
