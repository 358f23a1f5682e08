#pragma once
// The pieces every model file uses, each in its own file: the parameter table
// (param_table.h), config.json accessors (config_access.h), dense layers and the block
// wrapper (layers.h), decoder inputs (decoder_inputs.h) and the KV cache (kv_cache.h).
#include "meshtrain/models/config_access.h"
#include "meshtrain/models/decoder_inputs.h"
#include "meshtrain/models/kv_cache.h"
#include "meshtrain/models/layers.h"
#include "meshtrain/models/param_table.h"
