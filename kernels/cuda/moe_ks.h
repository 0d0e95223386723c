/*
 * moe_ks.h - the rule that picks, at launch, how many warps split one tile of the grouped MoE
 * expert kernels (moe_experts.cu on f16 stacks, moe_experts_nvfp4.cu on NVFP4 ones): one
 * cost model, each kernel with its own unit cost and occupancy. Host code only.
 *
 * A pass is `units` independent pieces of work (tile groups x expert slots). Split over ks
 * warps, a unit takes ceil(steps / ks) + unit_cost steps of its warps, and an SM holds
 * floor(warps_sm / (rt ks)) blocks of rt tiles: the pass costs rounds x unit time, rounds =
 * ceil(units / resident places). Few units (decode at B1) want the split that fills the
 * places in one round; many units want whole rows a warp (ks 1), since every warp of a split
 * pays the unit's fixed cost. unit_cost is the fixed work a unit does besides its steps
 * (lookups, pipeline fill, the block's sum), in that kernel's steps. The slots, not the
 * experts a routing uses, count, so the choice is fixed by n, k and E (a captured graph
 * keeps it) but moves with the batch: batch invariance takes a fixed split instead.
 */
#ifndef SM70_KERNELS_CUDA_MOE_KS_H
#define SM70_KERNELS_CUDA_MOE_KS_H

#define SM70__MOE_MAX_KS 8 /* the most warps a tile; SM70_MOE_KS takes 1..this */

/* The cheapest ks in 1 .. SM70__MOE_MAX_KS (and rt ks <= warps_sm) by the model above; the
 * first of equal costs, so fewer warps win a tie. */
static inline int sm70__moe_pick_ks(int n_sm, int rt, int warps_sm, long units, int steps,
				    int unit_cost)
{
	long best = -1;
	int pick = 1;

	for (int ks = 1; ks <= SM70__MOE_MAX_KS; ks++) {
		const long res = (long)n_sm * (warps_sm / (rt * ks));
		long cost;

		if (res == 0)
			break;
		cost = (units + res - 1) / res * ((steps + ks - 1) / ks + unit_cost);
		if (best < 0 || cost < best) {
			best = cost;
			pick = ks;
		}
	}
	return pick;
}

#endif
