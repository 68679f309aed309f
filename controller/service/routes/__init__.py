"""One APIRouter per resource; handlers only translate between HTTP and :class:`Runtime` calls."""
