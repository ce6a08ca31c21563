"""Wrong: hands the work to the library's ring."""

from course_lib.core.collectives import ring_all_reduce as library_ring


def ring_all_reduce(tensor, group=None):
    return library_ring(tensor, group)
