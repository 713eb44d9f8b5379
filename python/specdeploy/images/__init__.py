"""Stage 3, images: the engine image built from the profile's pins (`build`), made present on a
host by build, pull-by-digest or archive and proven by its labels (`ensure`), and the guards
that run inside the image builds (`guards`, standard library only: the Containerfiles copy it)."""
