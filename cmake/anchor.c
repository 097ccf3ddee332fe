/* Keeps an object library valid while a module has no source yet. */
typedef int orb_anchor_unused;
