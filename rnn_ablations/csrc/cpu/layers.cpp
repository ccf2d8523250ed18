// The three entry-point files of one recurrent layer (entry_points.h) compiled as one translation
// unit: they include the same torch headers and instantiate the same step templates
// (step_state.h), which one compiler then parses and instantiates once.  Compiled apart, they cost
// about 30 CPU s of a first-use build on a 2-core AMD EPYC, together about 14 s.  The build
// (rnn_ablations/kernels/build.py, INCLUDED_SOURCES) does not compile them on their own.
#include "layer_plain.cpp"
#include "layer_pipelined.cpp"
#include "layer_directions.cpp"
